/*
 * fuzz_config.c - libFuzzer harness: arbitrary bytes as a config file.
 * The parser must accept or refuse with a message, never crash or leak.
 */
#include "config/config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = malloc(size + 1);
	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	struct config *cfg = NULL;
	char err[512];
	if (config_parse_string(text, "fuzz.conf", &cfg, err, sizeof(err)) == 0)
		config_free(cfg);
	free(text);
	return 0;
}
