/*
 * nvme_health.h - what an NVMe cache leg says about its own health.
 *
 * Why: a mirrored cache is only as safe as its legs, and NVMe drives warn
 * before they die (SMART critical warning, spare capacity running out,
 * media errors). This module asks a leg's device through libnvme and hands
 * back plain numbers; the leg code decides what to do with them (report
 * them in `tierctl status`, fail a leg proactively via
 * nvme_health_failing()). Legs that are not NVMe namespaces (files, other
 * block devices) are reported as such, with no error.
 *
 * Usage:
 *     struct nvme_health h;
 *     if (nvme_health_read("/dev/nvme0n1", &h) == 0 && h.is_nvme &&
 *         nvme_health_failing(&h, why, sizeof(why)))
 *             fail the leg, log why;
 *
 * Threading contract: every function may be called from any thread; none
 * keeps state. nvme_health_read issues admin ioctls that can block for up
 * to the driver's admin timeout, so call it from the main or control
 * thread (or a helper thread), never from a worker's event loop. Reading
 * identify and SMART needs CAP_SYS_ADMIN; without it the result says
 * is_nvme with smart_valid false and a sentence in error.
 */
#ifndef TC_CACHE_NVME_HEALTH_H
#define TC_CACHE_NVME_HEALTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct nvme_health {
	/* What the path is: "NVMe namespace", "regular file", "block device
	 * (not NVMe)", "character device (not an NVMe namespace)", ... */
	char kind[48];
	bool is_nvme;               /* an NVMe namespace block device */
	uint32_t nsid;              /* namespace id (is_nvme) */

	/* Identify Controller (is_nvme and ident_valid), trailing blanks cut. */
	bool ident_valid;
	char model[41];
	char serial[21];
	char firmware[9];

	/* SMART / Health Information log page 02h, controller-wide. */
	bool smart_valid;
	uint8_t critical_warning;   /* NVME_SMART_CRIT_* bits */
	int temperature_c;          /* composite temperature, degrees Celsius */
	uint8_t percent_used;       /* endurance estimate; may exceed 100 */
	uint8_t available_spare;    /* percent */
	uint8_t spare_threshold;    /* percent */
	uint64_t media_errors;      /* low 64 bits of the 128-bit counter */
	uint64_t power_on_hours;
	uint64_t unsafe_shutdowns;

	/*
	 * The largest aligned write the device promises to land whole or not
	 * at all across a power failure, in bytes; 0: unknown (a regular file:
	 * the filesystem promises nothing). NVMe: (AWUPF + 1) logical blocks
	 * of the namespace's format, or its own NAWUPF when it reports one.
	 * Another block device: its logical block size. A LUN whose blocks are
	 * larger can see a block part old, part new after a power cut during
	 * an overwrite.
	 */
	uint32_t atomic_write_bytes;
	uint32_t logical_block;     /* the namespace's (or block device's) logical block size */

	/* Why identify or SMART could not be read (empty when all is well). */
	char error[160];
};

/*
 * Classify path and, for an NVMe namespace, read Identify Controller and
 * the SMART log. Returns 0 when the path could be examined (whatever it
 * turned out to be), or -errno when it cannot be stat()ed or opened, with
 * a sentence in h->error.
 */
int nvme_health_read(const char *path, struct nvme_health *h);

/*
 * Should the leg be failed before it loses data? True when the SMART
 * critical warning says spare below threshold, reliability degraded,
 * media read-only or volatile backup failed, or when available spare is
 * below its threshold; why gets a sentence. Temperature alone is not a
 * reason (it is reported, not acted on). False when SMART is unknown.
 */
bool nvme_health_failing(const struct nvme_health *h, char *why, size_t whylen);

/* "spare below threshold, media read-only" style text for the bits set. */
void nvme_health_warning_text(uint8_t critical_warning, char *buf, size_t len);

#endif
