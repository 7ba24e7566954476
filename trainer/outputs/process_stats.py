"""What a process measures of itself: its age and its peak memory. No TensorFlow
here, so that a process can time its own imports with the same clock."""

import os
import resource
import time

import psutil


def peak_rss_mib() -> float:
  """Peak resident memory of this process so far, in MiB (Linux reports KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def seconds_since_process_start() -> float:
  """Seconds since this process started (a forked child: since its fork), to
  the kernel's clock tick (10 ms).

  Linux records a process's start in ticks since boot: measured against the
  boot-time clock, that is exact. psutil's create_time() adds the boot time,
  which Linux gives in whole seconds, so `time.time() - create_time()` is off
  by a constant of up to a second (0.69 s on this project's VM), the fallback
  where there is no /proc.
  """
  try:
    with open("/proc/self/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()  # The name may hold spaces.
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # Field 22: starttime.
    return time.clock_gettime(time.CLOCK_BOOTTIME) - started
  except (OSError, ValueError, IndexError, AttributeError):
    return time.time() - psutil.Process().create_time()
