/*
 * fixed_seed.c - an LD_PRELOAD shim that makes srand() and srandom() do
 * nothing, so that rand() and random() give glibc's unseeded sequence (the
 * one of seed 1) in every run of a program.
 *
 * For tests/tools/replay_compare.sh: iscsi-test-cu seeds random() from the
 * clock and its pid for its persistent reservation keys (rand_key()) and
 * the byte its VERIFY mismatch tests flip, and libiscsi seeds rand() from
 * /dev/urandom for the ISID, ITT and CmdSN. The keys come back in PERSISTENT
 * RESERVE IN data, the ISID in its transport IDs and the flipped byte's
 * offset in the MISCOMPARE sense: with the shim two runs of the suite send
 * the same keys and flip the same bytes, and their answers can be compared
 * byte for byte.
 *
 *   cc -shared -fPIC -o fixed_seed.so tests/tools/fixed_seed.c
 *   LD_PRELOAD=./fixed_seed.so iscsi-test-cu ...
 */
#include <stdlib.h>

void srand(unsigned int seed)
{
	(void)seed;
}

void srandom(unsigned int seed)
{
	(void)seed;
}
