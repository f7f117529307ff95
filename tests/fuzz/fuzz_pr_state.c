/*
 * fuzz_pr_state.c - libFuzzer harness: arbitrary bytes as the persistent
 * reservation state a LU reads from its state file or, shared by several
 * gateways, from the cluster (pr_shared.c), where any gateway or anyone
 * with access to the pool may have written it. It must be installed or
 * refused, never crash or leak; and a state installed is written back as
 * text that reads back to the same text (the version line included).
 */
#include "backstore/pr_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct scsi_lu lu;
	uint64_t ver = 0, ver2 = 0;
	if (pr_install(&lu, (const char *)data, size, &ver) == 0) {
		size_t len = 0, len2 = 0;
		char *text = pr_encode(&lu, ver, true, &len);
		if (text) {
			if (pr_install(&lu, text, len, &ver2) != 0 || ver2 != ver)
				abort(); /* what we write must read back */
			char *again = pr_encode(&lu, ver2, true, &len2);
			if (!again || len2 != len || memcmp(text, again, len))
				abort();
			free(again);
			free(text);
		}
	}
	pr_clear_state(&lu);
	return 0;
}
