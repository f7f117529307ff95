/*
 * nvme_health.c - read an NVMe leg's identity and SMART log with libnvme.
 *
 * The path is classified first with stat(): regular files and character
 * devices are never NVMe namespaces; a block device is one exactly when
 * the NVMe namespace-id ioctl (libnvme's nvme_get_nsid) answers on it.
 * For namespaces we then send Identify Controller and Get Log Page (SMART,
 * all namespaces) through the namespace's own descriptor; the kernel routes
 * admin commands to the controller.
 */
#include "cache/nvme_health.h"

#include <errno.h>
#include <fcntl.h>
#include <libnvme.h>
#include <stdio.h>
#include <string.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

/* Copy a space-padded identify string, dropping the padding. */
static void copy_trimmed(char *dst, size_t dstlen, const char *src, size_t srclen)
{
	size_t n = srclen < dstlen - 1 ? srclen : dstlen - 1;
	memcpy(dst, src, n);
	dst[n] = '\0';
	while (n > 0 && (dst[n - 1] == ' ' || dst[n - 1] == '\0'))
		dst[--n] = '\0';
}

/* Low 64 bits of a little-endian 128-bit SMART counter. */
static uint64_t le128_low(const uint8_t b[16])
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | b[i];
	return v;
}

static void describe_failure(char *buf, size_t len, const char *what, int r)
{
	if (r < 0)
		snprintf(buf, len, "%s failed: %s%s", what, strerror(errno),
			 errno == EPERM || errno == EACCES ? " (needs CAP_SYS_ADMIN)" : "");
	else
		snprintf(buf, len, "%s failed: NVMe status 0x%x (%s)", what, (unsigned)r,
			 nvme_status_to_string(r, false));
}

/* a little-endian 16-bit field of an identify page */
static uint32_t le16v(const void *p)
{
	const uint8_t *b = p;
	return (uint32_t)b[0] | (uint32_t)b[1] << 8;
}

static void read_nvme(int fd, struct nvme_health *h)
{
	struct nvme_id_ctrl id;
	struct nvme_smart_log smart;
	int r;

	memset(&id, 0, sizeof(id));
	r = nvme_identify_ctrl(fd, &id);
	if (r != 0) {
		describe_failure(h->error, sizeof(h->error), "Identify Controller", r);
		return;
	}
	h->ident_valid = true;
	struct nvme_id_ns ns;
	memset(&ns, 0, sizeof(ns));
	if (nvme_identify_ns(fd, h->nsid, &ns) == 0) {
		uint8_t fmt;
		nvme_id_ns_flbas_to_lbaf_inuse(ns.flbas, &fmt);
		if (fmt < 64 && ns.lbaf[fmt].ds >= 9 && ns.lbaf[fmt].ds < 32) {
			uint32_t lb = 1u << ns.lbaf[fmt].ds;
			uint32_t units = (uint32_t)le16v(&id.awupf) + 1; /* 0's based */
			if ((ns.nsfeat & NVME_NS_FEAT_NATOMIC) && le16v(&ns.nawupf))
				units = (uint32_t)le16v(&ns.nawupf) + 1;
			h->logical_block = lb;
			h->atomic_write_bytes = units * lb;
		}
	}
	copy_trimmed(h->model, sizeof(h->model), id.mn, sizeof(id.mn));
	copy_trimmed(h->serial, sizeof(h->serial), id.sn, sizeof(id.sn));
	copy_trimmed(h->firmware, sizeof(h->firmware), id.fr, sizeof(id.fr));

	memset(&smart, 0, sizeof(smart));
	r = nvme_get_log_smart(fd, NVME_NSID_ALL, false, &smart);
	if (r != 0) {
		describe_failure(h->error, sizeof(h->error), "SMART log", r);
		return;
	}
	h->smart_valid = true;
	h->critical_warning = smart.critical_warning;
	/* Composite temperature is in kelvins, little-endian. */
	h->temperature_c = (int)(smart.temperature[0] | smart.temperature[1] << 8) - 273;
	h->percent_used = smart.percent_used;
	h->available_spare = smart.avail_spare;
	h->spare_threshold = smart.spare_thresh;
	h->media_errors = le128_low(smart.media_errors);
	h->power_on_hours = le128_low(smart.power_on_hours);
	h->unsafe_shutdowns = le128_low(smart.unsafe_shutdowns);
}

int nvme_health_read(const char *path, struct nvme_health *h)
{
	struct stat st;

	memset(h, 0, sizeof(*h));
	if (stat(path, &st) < 0) {
		int e = errno;
		snprintf(h->error, sizeof(h->error), "%s: %s", path, strerror(e));
		snprintf(h->kind, sizeof(h->kind), "unreachable");
		return -e;
	}
	if (S_ISREG(st.st_mode)) {
		snprintf(h->kind, sizeof(h->kind), "regular file");
		return 0;
	}
	if (S_ISCHR(st.st_mode)) {
		snprintf(h->kind, sizeof(h->kind), "character device (not an NVMe namespace)");
		return 0;
	}
	if (!S_ISBLK(st.st_mode)) {
		snprintf(h->kind, sizeof(h->kind), "not a file or block device");
		return 0;
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) {
		int e = errno;
		snprintf(h->error, sizeof(h->error), "%s: cannot open: %s", path, strerror(e));
		snprintf(h->kind, sizeof(h->kind), "block device");
		return -e;
	}
	uint32_t nsid = 0;
	if (nvme_get_nsid(fd, &nsid) < 0) {
		int lbs = 0;
		snprintf(h->kind, sizeof(h->kind), "block device (not NVMe)");
		if (ioctl(fd, BLKSSZGET, &lbs) == 0 && lbs > 0)
			h->logical_block = h->atomic_write_bytes = (uint32_t)lbs;
		close(fd);
		return 0;
	}
	snprintf(h->kind, sizeof(h->kind), "NVMe namespace");
	h->is_nvme = true;
	h->nsid = nsid;
	read_nvme(fd, h);
	close(fd);
	return 0;
}

void nvme_health_warning_text(uint8_t cw, char *buf, size_t len)
{
	static const struct {
		uint8_t bit;
		const char *text;
	} bits[] = {
		{ NVME_SMART_CRIT_SPARE, "available spare below threshold" },
		{ NVME_SMART_CRIT_TEMPERATURE, "temperature out of range" },
		{ NVME_SMART_CRIT_DEGRADED, "reliability degraded by media errors" },
		{ NVME_SMART_CRIT_MEDIA, "media placed in read-only mode" },
		{ NVME_SMART_CRIT_VOLATILE_MEMORY, "volatile memory backup failed" },
		{ NVME_SMART_CRIT_PMR_RO, "persistent memory region read-only" },
	};
	size_t used = 0;

	if (len == 0)
		return;
	buf[0] = '\0';
	for (size_t i = 0; i < sizeof(bits) / sizeof(bits[0]); i++) {
		if (!(cw & bits[i].bit))
			continue;
		int n = snprintf(buf + used, len - used, "%s%s", used ? ", " : "", bits[i].text);
		if (n < 0 || (size_t)n >= len - used)
			return;
		used += (size_t)n;
	}
	if (!used)
		snprintf(buf, len, "none");
}

bool nvme_health_failing(const struct nvme_health *h, char *why, size_t whylen)
{
	/* Temperature is a warning to act on with cooling, not a reason to
	 * drop a mirror leg; every other bit means the drive is losing data
	 * or about to. */
	const uint8_t fatal = NVME_SMART_CRIT_SPARE | NVME_SMART_CRIT_DEGRADED | NVME_SMART_CRIT_MEDIA |
			      NVME_SMART_CRIT_VOLATILE_MEMORY;
	char text[160];

	if (!h->is_nvme || !h->smart_valid)
		return false;
	if (h->critical_warning & fatal) {
		nvme_health_warning_text(h->critical_warning & fatal, text, sizeof(text));
		snprintf(why, whylen, "NVMe %s (serial %s) reports a critical warning: %s", h->model, h->serial,
			 text);
		return true;
	}
	if (h->available_spare < h->spare_threshold) {
		snprintf(why, whylen, "NVMe %s (serial %s) has %u%% spare capacity left, below its %u%% threshold",
			 h->model, h->serial, h->available_spare, h->spare_threshold);
		return true;
	}
	return false;
}
