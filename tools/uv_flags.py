"""uv's flags for what pip's configuration on this machine says, printed on one line.

`make install` installs with uv (several times faster than pip), which does not read
pip's configuration; this passes on the local wheel folders (`find-links`) and
constraint files that exist, so both pick the same wheels (e.g. a CPU build of torch
kept on disk). Other pip settings (private indexes) are not translated: there the
Makefile falls back to pip.
"""
import os
import subprocess
import sys


def main() -> None:
  listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                           capture_output=True, text=True, check=False).stdout
  flags = []
  for line in listing.splitlines():
    key, _, value = line.partition("=")
    name = key.rsplit(".", 1)[-1]
    for item in value.strip().strip("'\"").split():
      if name == "find-links" and os.path.isdir(item):
        flags.append(f"--find-links={item}")
      elif name == "constraint" and os.path.isfile(item):
        flags.append(f"--constraint={item}")
  print(" ".join(dict.fromkeys(flags)))


if __name__ == "__main__":
  main()
