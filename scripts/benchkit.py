"""What the benchmark scripts share: commands, packages, the build, loop devices, idle state.

Imported by scripts/real-apps, scripts/real-clients, scripts/vs-ext4 and
scripts/vs-fio (each puts this directory on sys.path first). Not a benchmark.
"""

import contextlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(cmd, **kw):
    """Runs cmd, raising on failure; returns the CompletedProcess with text output."""
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def ensure(tools):
    """Installs the Debian packages of the tools that are missing: {tool: package}."""
    missing = sorted({pkg for tool, pkg in tools.items()
                      if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}")})
    if not missing:
        return
    print(f"installing {', '.join(missing)} (Debian packages) ...", file=sys.stderr)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if subprocess.run(["apt-get", "install", "-y", "-qq", *missing], capture_output=True, env=env).returncode:
        subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, capture_output=True, env=env)


def build():
    """Builds iopath and its interposer (release); returns the paths of the binary and the library."""
    sh(["cargo", "build", "--release", "--quiet", "--workspace"], cwd=ROOT)
    binary = os.path.join(ROOT, "target", "release", "iopath")
    lib = os.path.join(ROOT, "target", "release", "libiopath_preload.so")
    for path in (binary, lib):
        if not os.path.exists(path):
            sys.exit(f"no {path} after cargo build")
    return binary, lib


def loop_device(size_bytes, name, fill=True):
    """A loop device with direct I/O over a file in /dev/shm, written through unless
    fill=False (a read of a hole in /dev/shm copies the shared zero page and skips the
    page lookup, and a write to one allocates a page, neither of which a device with
    data does: fio psync at 16 jobs ran ~15% faster over a sparse file). Returns
    (device, backing)."""
    backing = tempfile.mktemp(prefix=f"iopath-{name}-", suffix=".img", dir="/dev/shm")
    with open(backing, "wb") as f:
        if fill:
            chunk = os.urandom(1 << 20)
            for _ in range(size_bytes >> 20):
                f.write(chunk)
        else:
            f.truncate(size_bytes)
    return sh(["losetup", "--direct-io=on", "-f", "--show", backing]).stdout.strip(), backing


def drop_loop_device(dev, backing):
    """Detaches a loop device and removes its backing file."""
    subprocess.run(["losetup", "-d", dev], check=False)
    if os.path.exists(backing):
        os.unlink(backing)


def drop_caches():
    """Writes back and drops the kernel's page cache (root only)."""
    subprocess.run(["sync"], check=False)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


@contextlib.contextmanager
def idle_state(state):
    """Idle CPUs halt ("halt", the machine as it is) or poll ("poll": a 0 us PM QoS
    CPU latency request held on /dev/cpu_dma_latency, as cyclictest does) inside the block."""
    fd = None
    if state == "poll":
        fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
        os.write(fd, struct.pack("i", 0))
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


def alternating(sides, rounds):
    """(round, the sides in that round's order): who goes first alternates."""
    for r in range(rounds):
        yield r, list(sides) if r % 2 == 0 else list(sides)[::-1]
