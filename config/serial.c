/*
 * serial.c - the unit serial number a LUN is served with.
 *
 * serial = auto means: a random 16-hex-digit serial made once and kept in
 * state_dir/lun-NAME.serial, so it stays the same across restarts (hosts key
 * multipath and datastores on it) and differs between installations. The
 * daemon creates it; tools that only describe the setup (tierctl targetcli)
 * read it. Main or tool thread; may do file I/O.
 */
#include "config/config.h"

#include "common/statefile.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

static void copy_serial(char out[33], const char *s)
{
	size_t n = strlen(s);
	if (n > 32)
		n = 32;
	memcpy(out, s, n);
	out[n] = '\0';
}

int config_lun_serial(const struct config *cfg, const struct cfg_lun *l, bool create, char out[33])
{
	char path[PATH_MAX];
	FILE *f;

	if (strcmp(l->serial, "auto")) {
		copy_serial(out, l->serial);
		return 0;
	}
	snprintf(path, sizeof(path), "%s/lun-%s.serial", cfg->state_dir, l->name);
	f = fopen(path, "r");
	if (f) {
		char line[64] = "";
		if (fgets(line, sizeof(line), f))
			line[strcspn(line, "\r\n")] = '\0';
		fclose(f);
		if (strlen(line) >= 1 && strlen(line) <= 32) {
			copy_serial(out, line);
			return 0;
		}
	}
	if (!create)
		return -1;
	uint8_t rnd[8];
	if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd))
		return -1;
	for (int i = 0; i < 8; i++)
		sprintf(out + 2 * i, "%02x", rnd[i]);
	char line[40];
	int n = snprintf(line, sizeof(line), "%s\n", out);
	int err = state_file_replace(path, line, (size_t)n);
	if (err) {
		errno = -err;
		return -1;
	}
	return 0;
}
