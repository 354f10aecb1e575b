# shellcheck shell=bash
# Sourced by benchmarks/gpu/parity and benchmarks/gpu/throughput on the GPU machine, from
# the repository root: makes the bundle of scripts/gpu-bundle (.carry/gpu, or
# DSTRAIN_GPU_BUNDLE) runnable and finds the machine's NVIDIA libraries (docs/gpu.md).
#
#   dst_env_init        unpacks the bundle into $DST_STAGE, sets DST_BIN and DST_LD
#                       (the library path of bundled programs), fills DST_ENV_NOTES
#   dst_run CMD...      runs a bundled program with that library path and the Open MPI
#                       settings of a singleton start (no mpirun, one rank); the same
#                       prefix is the array DST_RUN, for `timeout N "${DST_RUN[@]}" CMD`
#   dst_env_json        the environment as a JSON object (libraries found, notes)
#
# The library path is given to bundled programs only, never exported: the bundle's
# libcrypto, libz or libffi (Debian 12's) would shadow the ones python3 and nvidia-smi
# of the machine were built with.

# Where each NVIDIA library may be: the CUDA toolkit, the distribution's folders, the
# driver's mount, and the nvidia-* wheels of any Python (PyTorch's has cuDNN and NCCL).
dst_nvidia_search_dirs() {
  local d py
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
    /usr/local/cuda-*/lib64 /usr/local/cuda-*/lib /usr/local/cuda-*/targets/x86_64-linux/lib \
    /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
    [[ -d $d ]] && echo "$d"
  done
  for py in python3 /opt/torch/.venv/bin/python3 /usr/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    "$py" -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null
  done | sort -u | while read -r d; do
    for l in "$d"/nvidia/*/lib "$d"/nvidia/cu*/lib; do [[ -d $l ]] && echo "$l"; done
  done
  for d in /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib /usr/local/lib/python3*/dist-packages/nvidia/*/lib; do
    [[ -d $d ]] && echo "$d"
  done
}

# dst_find_lib SONAME: the first folder of dst_nvidia_search_dirs holding it.
dst_find_lib() {
  local d
  while read -r d; do
    [[ -e "$d/$1" ]] && { echo "$d"; return 0; }
  done < <(dst_nvidia_search_dirs | awk '!seen[$0]++')
  return 1
}

dst_env_init() {
  local root bundle
  root=$(pwd)
  bundle=${DSTRAIN_GPU_BUNDLE:-$root/.carry/gpu}
  [[ -f "$bundle/MANIFEST" ]] || {
    echo "env.sh: no bundle at $bundle (run scripts/gpu-bundle on the build machine, carry .carry/gpu)" >&2
    return 1
  }
  DST_BUNDLE=$bundle
  DST_STAGE=${DSTRAIN_GPU_STAGE:-${TMPDIR:-/tmp}/dstrain-gpu}
  rm -rf "$DST_STAGE"
  mkdir -p "$DST_STAGE"
  cp -a "$bundle/." "$DST_STAGE/"
  # Files scripts/gpu-bundle stored xz-compressed (over its pack size).
  local f
  while IFS= read -r -d '' f; do
    if command -v xz >/dev/null; then
      xz -d "$f"
    else
      python3 -c 'import lzma, os, sys; f = sys.argv[1]; open(f[:-3], "wb").write(lzma.open(f).read()); os.remove(f)' "$f"
    fi || { echo "env.sh: cannot unpack $f" >&2; return 1; }
  done < <(find "$DST_STAGE" -name '*.xz' -print0)
  chmod +x "$DST_STAGE"/bin/* 2>/dev/null || true
  DST_BIN=$DST_STAGE/bin
  DST_ENV_NOTES=()
  DST_NVIDIA_LIBS=()

  # The NVIDIA libraries the binaries need and the bundle leaves to the machine: found by
  # the loader already (ld.so.cache), or searched for; libcuda is the driver's.
  local so path dir dirs=()
  while read -r so path; do
    if [[ $path == not-found ]]; then
      if dir=$(dst_find_lib "$so"); then
        DST_NVIDIA_LIBS+=("$so=$dir/$so")
        [[ " ${dirs[*]} " == *" $dir "* ]] || dirs+=("$dir")
      else
        DST_NVIDIA_LIBS+=("$so=not-found")
        DST_ENV_NOTES+=("$so not found on this machine")
      fi
    else
      # Found already (ld.so.cache, or the binary's RUNPATH): named on the library path
      # anyway, so that what these libraries load themselves (cuDNN's engine libraries)
      # comes from the same folder.
      DST_NVIDIA_LIBS+=("$so=$path")
      dir=$(dirname "$path")
      [[ " ${dirs[*]} " == *" $dir "* ]] || dirs+=("$dir")
    fi
  done < <(for b in "$DST_BIN"/*; do LD_LIBRARY_PATH=$DST_STAGE/lib ldd "$b" 2>/dev/null; done |
    awk '$2 == "=>" && $1 ~ /^lib(cuda|cublas|cublasLt|cudnn[a-z_]*|nccl|nvrtc[a-z.-]*|nvJitLink)\.so/ {
           print $1, ($3 == "not" ? "not-found" : $3) }' | sort -u)
  if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
    if dir=$(dst_find_lib libcuda.so.1); then
      DST_NVIDIA_LIBS+=("libcuda.so.1=$dir/libcuda.so.1")
      [[ " ${dirs[*]} " == *" $dir "* ]] || dirs+=("$dir")
    elif [[ -n $(find "$DST_BIN" -name '*cuda*' -o -name '*gemm*') ]]; then
      DST_NVIDIA_LIBS+=("libcuda.so.1=not-found")
      DST_ENV_NOTES+=("libcuda.so.1 (the driver) is neither in ld.so.cache nor in the searched folders")
    fi
  else
    DST_NVIDIA_LIBS+=("libcuda.so.1=$(ldconfig -p | awk '$1 == "libcuda.so.1" { print $NF; exit }')")
  fi
  local nv_path
  nv_path=$(IFS=:; echo "${dirs[*]}")
  DST_LD=$DST_STAGE/lib${nv_path:+:$nv_path}

  # libstdc++ / libgcc_s: the machine's own unless they are older than the build's.
  local report
  report=$(for b in "$DST_BIN"/*; do LD_LIBRARY_PATH=$DST_LD ldd "$b" 2>&1; done)
  if grep -Eq "(GLIBCXX|CXXABI|GCC)_[0-9.]+' not found|(libstdc\+\+|libgcc_s)\.so\.[0-9]+ => not found" <<<"$report"; then
    DST_LD=$DST_STAGE/lib:$DST_STAGE/lib/compat${nv_path:+:$nv_path}
    DST_ENV_NOTES+=("the machine's libstdc++/libgcc_s are older than the build's: using the bundle's (lib/compat)")
    report=$(for b in "$DST_BIN"/*; do LD_LIBRARY_PATH=$DST_LD ldd "$b" 2>&1; done)
  fi
  if grep -q "GLIBC_[0-9.]*' not found" <<<"$report"; then
    DST_ENV_NOTES+=("the machine's glibc is older than the build machine's (Debian 12, glibc 2.36): $(grep -o "GLIBC_[0-9.]*' not found" <<<"$report" | sort -u | tr '\n' ' ')")
  fi
  local missing
  missing=$(awk '$2 == "=>" && $3 == "not" { print $1 }' <<<"$report" | sort -u | tr '\n' ' ')
  [[ -z $missing ]] || DST_ENV_NOTES+=("still not found: $missing")
  # The prefix that runs a bundled program (usable with timeout, which takes no function).
  # shellcheck disable=SC2054  # the commas are inside values (btl=self,vader)
  DST_RUN=(env LD_LIBRARY_PATH="$DST_LD"
    OPAL_PKGLIBDIR="$DST_STAGE/lib/openmpi" OMPI_MCA_mca_base_component_path="$DST_STAGE/lib/openmpi"
    PMIX_MCA_mca_base_component_path="$DST_STAGE/lib/pmix" OPAL_PKGDATADIR="$DST_STAGE/share/openmpi"
    OMPI_MCA_ess_singleton_isolated=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
    OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl_base_warn_component_unused=0)
  return 0
}

dst_run() { "${DST_RUN[@]}" "$@"; }

# dst_env_json: {"bundle": ..., "ld_library_path": ..., "nvidia_libs": {...}, "notes": [...]}
dst_env_json() {
  python3 - "$DST_BUNDLE" "$DST_LD" "${#DST_NVIDIA_LIBS[@]}" "${DST_NVIDIA_LIBS[@]}" "${DST_ENV_NOTES[@]}" <<'PY'
import json, sys
bundle, ld, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
libs = dict(a.split("=", 1) for a in sys.argv[4:4 + n])
notes = sys.argv[4 + n:]
print(json.dumps({"bundle": bundle, "ld_library_path": ld, "nvidia_libs": libs, "notes": notes}))
PY
}
