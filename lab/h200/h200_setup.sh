#!/usr/bin/env bash
# Prepares a fresh GPU machine for a run, from the working tree the device
# tool copied there: Vulkan's loader and GL libraries from .gl/*.deb (the
# machine has none), and the binaries in .gpu/ unpacked from the .xz files
# they travel as (lab/h200/h200_pack.sh makes them; the machine has python3
# but no xz). Run it first:
#
#   bash lab/h200/h200_setup.sh && WEBDRAFT=.gpu/webdraft OUT=$OUT bash lab/h200/h200_perf.sh
set -eu
for f in .gl/*.deb; do dpkg -x "$f" / > /dev/null; done
ldconfig
for f in .gpu/*.xz; do
  [ -e "$f" ] || continue
  python3 -c "import lzma, sys; open(sys.argv[1][:-3], 'wb').write(lzma.open(sys.argv[1]).read())" "$f"
  chmod +x "${f%.xz}"
done
