#!/usr/bin/env bash
# Prepares running aarch64 binaries on this machine under qemu-user:
#   scripts/qemu-aarch64.sh <dir> <aarch64 binary>
# writes <dir>/root (the aarch64 glibc/libstdc++ from Debian's cross packages,
# plus a /proc/cpuinfo of an aarch64 CPU: ONNX Runtime's CPU detection reads it
# and crashes on the host's x86 one) and <dir>/tern, a wrapper that runs the
# binary with a 39-bit guest address space (-R 512G), as on Jetson kernels.
set -euo pipefail
dir=$1
bin=$(realpath "$2")
if ! command -v qemu-aarch64 >/dev/null || [ ! -e /usr/aarch64-linux-gnu/lib/libstdc++.so.6 ]; then
    apt-get update -qq
    apt-get install -y -qq qemu-user libc6-arm64-cross libstdc++6-arm64-cross libgcc-s1-arm64-cross
fi
mkdir -p "$dir/root/proc" "$dir/root/usr"
ln -sfn /usr/aarch64-linux-gnu/lib "$dir/root/lib"
ln -sfn /usr/aarch64-linux-gnu/lib "$dir/root/usr/lib"
: > "$dir/root/proc/cpuinfo"
for i in 0 1; do
    cat >> "$dir/root/proc/cpuinfo" <<CPU
processor	: $i
BogoMIPS	: 62.50
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer	: 0x41
CPU architecture: 8
CPU variant	: 0x1
CPU part	: 0xd42
CPU revision	: 1

CPU
done
root=$(realpath "$dir/root")
cat > "$dir/tern" <<WRAP
#!/bin/sh
exec qemu-aarch64 -R 512G -L $root $bin "\$@"
WRAP
chmod +x "$dir/tern"
echo "$dir/tern runs $bin under qemu-aarch64"
