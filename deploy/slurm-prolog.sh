#!/bin/sh
# Slurm Prolog/Epilog for the gridledger meter's allocation = "slurm-prolog" (SPEC §7.1.2):
# the prolog writes the job's account, partition and GPU indices on this node to
# $DIR/<job id>.env; the epilog removes it. In slurm.conf:
#     Prolog=/etc/gridledger/slurm-prolog.sh
#     Epilog=/etc/gridledger/slurm-prolog.sh
# The meter reads the directory at the end of each interval (meter/allocation.py).
DIR=${GRIDLEDGER_SLURM_JOBS:-/run/gridledger/slurm-jobs}
FILE="$DIR/$SLURM_JOB_ID.env"
if [ "$SLURM_SCRIPT_CONTEXT" = "epilog_slurmd" ]; then
    rm -f "$FILE"
    exit 0
fi
mkdir -p "$DIR"
umask 022
{
    echo "SLURM_JOB_ID=$SLURM_JOB_ID"
    echo "SLURM_JOB_ACCOUNT=$SLURM_JOB_ACCOUNT"
    echo "SLURM_JOB_PARTITION=$SLURM_JOB_PARTITION"
    echo "SLURM_JOB_GPUS=${SLURM_JOB_GPUS:-$CUDA_VISIBLE_DEVICES}"
} > "$FILE.tmp" && mv "$FILE.tmp" "$FILE"
exit 0
