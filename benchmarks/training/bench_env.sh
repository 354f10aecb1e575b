# Sourced by the training benchmarks (ddp_compare.sh, overlap.sh, grad_backend.sh): the
# work directory and the environment every run of them shares.
# The runs' directories go in DSTRAIN_BENCH_WORK, kept; without it in a temporary
# directory removed at the end.
if [[ -n ${DSTRAIN_BENCH_WORK:-} ]]; then
  work=$DSTRAIN_BENCH_WORK
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
# One thread per process (BLAS, OpenMP, PyTorch), on both sides of any comparison; Open
# MPI as root, over shared memory.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader} OMPI_MCA_btl_vader_single_copy_mechanism=none
