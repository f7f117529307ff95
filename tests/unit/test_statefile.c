/*
 * test_statefile.c - state_file_replace (common/statefile.c): the file
 * holds exactly the new bytes and no PATH.tmp is left; a replace that
 * cannot complete leaves the old file as it was and no PATH.tmp either.
 * That it fsyncs the directory after the rename is checked through the
 * daemon, under strace (tests/test_state_durable.sh).
 */
#include "common/statefile.h"
#include "tests/unit/check.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[] = "/tmp/tc-statefile-XXXXXX";

static bool holds(const char *path, const char *want)
{
	char buf[256] = "";
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	return !strcmp(buf, want);
}

static bool exists(const char *path)
{
	return access(path, F_OK) == 0;
}

int main(void)
{
	REQUIRE(mkdtemp(dir), "mkdtemp");
	char path[512], tmp[600], sub[512], subtmp[600];
	snprintf(path, sizeof(path), "%s/lun-a.serial", dir);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);

	CHECK(state_file_replace(path, "0123abcd\n", 9) == 0 && holds(path, "0123abcd\n") && !exists(tmp),
	      "a new file holds its bytes, no .tmp left");
	CHECK(state_file_replace(path, "42\n", 3) == 0 && holds(path, "42\n") && !exists(tmp),
	      "a replace holds the new bytes only (shorter than the old), no .tmp left");

	/* a leftover .tmp of a killed writer is not in the way */
	FILE *f = fopen(tmp, "w");
	REQUIRE(f, "make a stale .tmp");
	fputs("half-writ", f);
	fclose(f);
	CHECK(state_file_replace(path, "43\n", 3) == 0 && holds(path, "43\n") && !exists(tmp),
	      "a stale .tmp from a killed writer is replaced, then gone");

	/* the rename cannot happen: PATH is a directory that is not empty */
	snprintf(sub, sizeof(sub), "%s/busy", dir);
	snprintf(subtmp, sizeof(subtmp), "%s/busy/x", dir);
	REQUIRE(mkdir(sub, 0700) == 0, "mkdir");
	f = fopen(subtmp, "w");
	REQUIRE(f, "file in the directory");
	fclose(f);
	int r = state_file_replace(sub, "x\n", 2);
	char subdot[600];
	snprintf(subdot, sizeof(subdot), "%s.tmp", sub);
	CHECK(r < 0 && exists(subtmp) && !exists(subdot), "a failed rename returns %d (%s), leaves PATH and no .tmp", r,
	      strerror(-r));

	/* no such directory */
	char nodir[600];
	snprintf(nodir, sizeof(nodir), "%s/gone/lun-b.serial", dir);
	r = state_file_replace(nodir, "x\n", 2);
	CHECK(r == -ENOENT, "a missing directory: %d (-ENOENT wanted)", r);

	unlink(subtmp);
	rmdir(sub);
	unlink(path);
	rmdir(dir);
	return check_failures ? 1 : 0;
}
