"""ensemble_jax: N independent short runs vs one long synchronized run, in JAX."""
from setuptools import find_packages, setup

setup(
    name="ensemble_jax",
    version="0.1.0",
    description="Ensembles of independent short runs vs data-parallel training, in JAX/Flax.",
    # experiments/ ships too: its configs are what `--config` and the notebooks load.
    packages=find_packages(include=["ensemble_jax", "ensemble_jax.*", "experiments",
                                    "experiments.*"]),
    python_requires=">=3.10",
    # Lower bounds are the versions tested (Python 3.11, CPU): jax 0.10.2, flax 0.12.8,
    # optax 0.2.8, orbax-checkpoint 0.12.8, grain 0.2.18, tensorflow-datasets 4.9.10.
    install_requires=[
        "jax>=0.10.2",
        "flax>=0.12.8",
        "optax>=0.2.8",
        "orbax-checkpoint>=0.12.8",
        "tensorflow-datasets>=4.9.10",
        "ml-collections>=1.1.0",
        "einops>=0.8",
        "grain>=0.2.18",
        "clu>=0.0.12",
        "tensorboardX>=2.6",  # writes the event files
        "tensorboard>=2.17",  # the viewer: `tensorboard --logdir WORKDIR`
        "zstandard>=0.25.0",
        "tokenizers>=0.23.3",
        "matplotlib>=3.8",
        "tqdm>=4.66",
        "absl-py>=2.1",
        "numpy>=1.26",
        "pillow>=10.0",
        "jinja2>=3.1",  # the results pages' templates (experiments/docs_render.py)
    ],
    extras_require={
        # torch + transformers: the reference GPT-2 the Flax model is checked against.
        # torch is pinned: 2.13.0 is the CPU wheel here; an open range pulls CUDA builds.
        "test": ["pytest>=8", "pytest-xdist>=3.5", "chex>=0.1.90", "torch==2.13.0",
                 "transformers>=5.23.0", "nbclient>=0.11.0", "nbformat>=5.11.1",
                 "ipykernel>=7.4.0", "jupyter-client>=8.10.0",
                 "markdown-it-py>=3.0", "submitit>=1.5.4"],
        # --launcher=slurm: the study's jobs submitted to SLURM (experiments/sweeps/launcher.py).
        "slurm": ["submitit>=1.5.4"],
        "cuda": ["jax[cuda12]>=0.10.2"],
        "tpu": ["jax[tpu]>=0.10.2"],
    },
)
