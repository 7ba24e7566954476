"""A stand-in for `python -m trainer.main` in launcher tests: no TensorFlow.

`fake_worker.py --victim=I --dir=D [flags...]`: worker I (by its TF_CONFIG index)
writes its pid to D/victim.pid and kills itself with SIGKILL; every other worker
waits until it is dead (a zombie, or reaped), then exits 7 at once, as a peer
whose collective lost the victim would: both may end between two looks of the
launcher. Whatever order the launcher sees the exits in, it must name the victim.
"""

import argparse
import json
import os
import signal
import time

parser = argparse.ArgumentParser()
parser.add_argument("--victim", type=int)
parser.add_argument("--dir")
args, _ = parser.parse_known_args()
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
pid_file = os.path.join(args.dir, "victim.pid")
if index == args.victim:
  with open(pid_file + ".tmp", "w") as f:
    f.write(str(os.getpid()))
  os.replace(pid_file + ".tmp", pid_file)
  os.kill(os.getpid(), signal.SIGKILL)
while not os.path.exists(pid_file):
  time.sleep(0.001)
with open(pid_file) as f:
  victim = int(f.read())


def alive(pid):
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:  # Reaped.
    return False


while alive(victim):
  time.sleep(0.001)
print("lost a peer", flush=True)
os._exit(7)
