#!/usr/bin/env bash
# Packs what tests/gpu/run.sh needs into one archive for a GPU machine that has the CUDA
# driver and libraries but not this project's build packages (OpenBLAS, jansson, PCRE2,
# link-grammar): the stripped binaries (built here with nvcc) and those shared libraries.
#
# usage: tests/gpu/bundle.sh [OUTPUT.tar.xz]     (default .gpu-bundle/bundle.tar.xz)
set -eu
cd "$(dirname "$0")/../.."
output=${1:-.gpu-bundle/bundle.tar.xz}
make -j"$(nproc)" build/marlhf build/tests/gpu/test_cuda build/tests/gpu/test_collectives build/bench/train_step \
    build/bench/decode build/bench/ops_breakdown > /dev/null
stage=$(mktemp -d)
mkdir -p "$stage/bundle/bin" "$stage/bundle/lib"
for program in build/marlhf build/tests/gpu/test_cuda build/tests/gpu/test_collectives build/bench/train_step \
    build/bench/decode build/bench/ops_breakdown; do
    strip -o "$stage/bundle/bin/$(basename "$program")" "$program"
done
# Every shared library the binaries use, except the C runtime and the CUDA libraries,
# which the GPU machine has in versions matching its driver.
ldd build/marlhf build/tests/gpu/test_cuda | awk '/=> \// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcudart|libcublas|libcublasLt|libstdc\+\+|libgcc_s)\.so' |
    while read -r library; do cp -L "$library" "$stage/bundle/lib/"; done
mkdir -p "$(dirname "$output")"
tar cJf "$output" -C "$stage" bundle
rm -rf "$stage"
echo "$output: $(du -h "$output" | cut -f1)"
