/*
 * test_nvme_health.c - cache/nvme_health.c tells NVMe namespaces from
 * everything else, and its leg-failure rule acts on the SMART bits that
 * mean data loss (spare, reliability, read-only media) but not on
 * temperature. The real NVMe path (identify + SMART from QEMU's emulated
 * controllers) is proven by tests/system/run-vm-tcmu.sh.
 */
#include "tests/unit/check.h"
#include "cache/nvme_health.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


static void test_regular_file(void)
{
	char path[] = "/tmp/tc-nvme-health-XXXXXX";
	int fd = mkstemp(path);
	struct nvme_health h;

	CHECK(fd >= 0, "scratch file created");
	if (fd < 0)
		return;
	close(fd);
	int r = nvme_health_read(path, &h);
	CHECK(r == 0, "a regular file is examined without error (r=%d)", r);
	CHECK(!h.is_nvme, "a regular file is not NVMe");
	CHECK(!strcmp(h.kind, "regular file"), "kind is \"%s\"", h.kind);
	CHECK(!h.smart_valid && !h.ident_valid, "no identify or SMART for a file");
	unlink(path);
}

static void test_char_device(void)
{
	struct nvme_health h;
	int r = nvme_health_read("/dev/null", &h);
	CHECK(r == 0, "/dev/null is examined without error");
	CHECK(!h.is_nvme, "/dev/null is not an NVMe namespace");
	CHECK(strstr(h.kind, "character device") != NULL, "/dev/null kind is \"%s\"", h.kind);
}

static void test_missing(void)
{
	struct nvme_health h;
	int r = nvme_health_read("/nonexistent/leg0", &h);
	CHECK(r == -ENOENT, "a missing path gives -ENOENT (r=%d)", r);
	CHECK(strstr(h.error, "/nonexistent/leg0") != NULL, "the error names the path: %s", h.error);
}

static struct nvme_health healthy(void)
{
	struct nvme_health h;
	memset(&h, 0, sizeof(h));
	h.is_nvme = h.ident_valid = h.smart_valid = true;
	snprintf(h.model, sizeof(h.model), "QEMU NVMe Ctrl");
	snprintf(h.serial, sizeof(h.serial), "tc0");
	h.available_spare = 100;
	h.spare_threshold = 10;
	h.temperature_c = 50;
	return h;
}

static void test_failing_rule(void)
{
	char why[256] = "";
	struct nvme_health h = healthy();

	CHECK(!nvme_health_failing(&h, why, sizeof(why)), "a healthy drive is not failed");

	h.critical_warning = 0x02; /* temperature only */
	CHECK(!nvme_health_failing(&h, why, sizeof(why)), "temperature alone does not fail a leg");

	h.critical_warning = 0x04; /* reliability degraded */
	CHECK(nvme_health_failing(&h, why, sizeof(why)) && strstr(why, "reliability degraded") &&
		      strstr(why, "tc0"),
	      "degraded reliability fails the leg: %s", why);

	h.critical_warning = 0x08;
	CHECK(nvme_health_failing(&h, why, sizeof(why)) && strstr(why, "read-only"),
	      "read-only media fails the leg: %s", why);

	h = healthy();
	h.available_spare = 5;
	CHECK(nvme_health_failing(&h, why, sizeof(why)) && strstr(why, "5% spare") && strstr(why, "10%"),
	      "spare below threshold fails the leg: %s", why);

	h.is_nvme = false;
	CHECK(!nvme_health_failing(&h, why, sizeof(why)), "a non-NVMe leg is never failed by this rule");
	h = healthy();
	h.smart_valid = false;
	h.critical_warning = 0xff;
	CHECK(!nvme_health_failing(&h, why, sizeof(why)), "unknown SMART is not a reason to fail");
}

static void test_warning_text(void)
{
	char buf[200];
	nvme_health_warning_text(0, buf, sizeof(buf));
	CHECK(!strcmp(buf, "none"), "no bits: \"%s\"", buf);
	nvme_health_warning_text(0x01 | 0x08, buf, sizeof(buf));
	CHECK(!strcmp(buf, "available spare below threshold, media placed in read-only mode"), "two bits: \"%s\"",
	      buf);
	nvme_health_warning_text(0xff, buf, 10);
	CHECK(strlen(buf) < 10, "a short buffer is never overrun");
}

int main(void)
{
	test_regular_file();
	test_char_device();
	test_missing();
	test_failing_rule();
	test_warning_text();
	printf("%s\n", check_failures ? "FAILED" : "all passed");
	return check_failures ? 1 : 0;
}
