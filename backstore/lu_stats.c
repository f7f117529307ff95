/*
 * lu_stats.c - what each LU's commands did, for metrics (daemon/metrics.c).
 *
 * Counted once per command in scsi_cmd_complete, by the thread completing
 * it, in a slot of its own: worker i writes slot i with plain relaxed
 * stores (one writer, so no atomic read-modify-write and no cache line
 * shared with another core), and threads that are not workers share the
 * last slot with atomic adds. A reader sums the slots with relaxed loads:
 * each counter is exact, and the sum is as consistent as a scrape needs
 * (a command may show in its kind's count and not yet in its histogram).
 *
 * Threading: lu_stats_count on the completing thread; scsi_lu_stats on any.
 */
#include "backstore/lu.h"

#include "common/worker.h"

#include <stdlib.h>
#include <string.h>

int lu_stats_init(struct scsi_lu *lu)
{
	lu->nstat = workers_count() + 1;
	lu->stat = aligned_alloc(64, sizeof(*lu->stat) * lu->nstat);
	if (!lu->stat)
		return -1;
	for (unsigned i = 0; i < lu->nstat; i++)
		for (size_t k = 0; k < sizeof(*lu->stat) / sizeof(uint64_t); k++)
			atomic_init((_Atomic uint64_t *)&lu->stat[i] + k, 0);
	return 0;
}

static enum scsi_io_kind io_kind(uint8_t op)
{
	switch (op) {
	case 0x08: case 0x28: case 0xa8: case 0x88: /* READ 6/10/12/16 */
		return SCSI_IO_READ;
	case 0x0a: case 0x2a: case 0xaa: case 0x8a: /* WRITE 6/10/12/16 */
	case 0x2e: case 0x8e:                       /* WRITE AND VERIFY 10/16 */
	case 0x41: case 0x93:                       /* WRITE SAME 10/16 */
	case 0x89:                                  /* COMPARE AND WRITE */
		return SCSI_IO_WRITE;
	default:
		return SCSI_IO_OTHER;
	}
}

static enum scsi_outcome outcome_of(enum scsi_io_kind k, uint8_t how)
{
	if (k == SCSI_IO_OTHER)
		return SCSI_OUT_NONE;
	switch (how) {
	case BDEV_OUT_HIT: return SCSI_OUT_HIT;
	case BDEV_OUT_PARTIAL: return SCSI_OUT_PARTIAL;
	case BDEV_OUT_MISS: return SCSI_OUT_MISS;
	case BDEV_OUT_BYPASS: return SCSI_OUT_BYPASS;
	default: return SCSI_OUT_BACKING;
	}
}

static unsigned lat_bucket(uint64_t ns)
{
	unsigned i = 0;
	while (i < SCSI_LAT_BUCKETS - 1 && ns > scsi_lat_bound_ns(i))
		i++;
	return i;
}

/* slot counter += v: a plain store on a worker's own slot, an atomic add on the shared one */
static inline void bump(_Atomic uint64_t *c, uint64_t v, bool shared)
{
	if (shared)
		atomic_fetch_add_explicit(c, v, memory_order_relaxed);
	else
		atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v, memory_order_relaxed);
}

static uint8_t sense_key(const struct scsi_cmd *cmd)
{
	if (cmd->sense_len < 3)
		return 0;
	uint8_t code = cmd->sense[0] & 0x7f;
	return (code == 0x72 || code == 0x73 ? cmd->sense[1] : cmd->sense[2]) & 0x0f;
}

void lu_stats_count(struct scsi_lu *lu, const struct scsi_cmd *cmd)
{
	struct worker *w = worker_self();
	unsigned i = w ? worker_index(w) : lu->nstat;
	bool shared = i >= lu->nstat - 1;
	struct lu_stat_slot *s = &lu->stat[shared ? lu->nstat - 1 : i];
	enum scsi_io_kind k = io_kind(cmd->cdb[0]);
	enum scsi_outcome o = outcome_of(k, cmd->outcome);
	uint64_t ns = lu_now_ns() - cmd->start_ns;

	bump(&s->cmds[k], 1, shared);
	if (k == SCSI_IO_READ && cmd->data_in_len)
		bump(&s->bytes[0], cmd->data_in_len, shared);
	else if (k == SCSI_IO_WRITE && cmd->status == SAM_STAT_GOOD && cmd->write_len)
		bump(&s->bytes[1], cmd->write_len, shared);
	switch (cmd->status) {
	case SAM_STAT_CHECK_CONDITION: bump(&s->sense_keys[sense_key(cmd)], 1, shared); break;
	case SAM_STAT_BUSY: bump(&s->busy, 1, shared); break;
	case SAM_STAT_RESERVATION_CONFLICT: bump(&s->resv_conflicts, 1, shared); break;
	case SAM_STAT_TASK_SET_FULL: bump(&s->task_set_full, 1, shared); break;
	case SAM_STAT_TASK_ABORTED: bump(&s->aborted, 1, shared); break;
	default: break;
	}
	bump(&s->lat[k][o][lat_bucket(ns)], 1, shared);
	bump(&s->lat_sum_ns[k][o], ns, shared);
}

void scsi_lu_stats(const struct scsi_lu *lu, struct scsi_lu_stats *out)
{
	memset(out, 0, sizeof(*out));
	for (unsigned i = 0; i < lu->nstat; i++) {
		const struct lu_stat_slot *s = &lu->stat[i];
#define SUM(f) out->f += atomic_load_explicit(&s->f, memory_order_relaxed)
		for (int k = 0; k < SCSI_IO_KINDS; k++) {
			SUM(cmds[k]);
			for (int o = 0; o < SCSI_OUTCOMES; o++) {
				SUM(lat_sum_ns[k][o]);
				for (int b = 0; b < SCSI_LAT_BUCKETS; b++)
					SUM(lat[k][o][b]);
			}
		}
		SUM(bytes[0]);
		SUM(bytes[1]);
		for (int k = 0; k < 16; k++)
			SUM(sense_keys[k]);
		SUM(busy);
		SUM(resv_conflicts);
		SUM(task_set_full);
		SUM(aborted);
#undef SUM
	}
	out->inflight = scsi_lu_inflight((struct scsi_lu *)lu);
	out->resv_synced = lu->prs ? (pr_shared_synced(lu) ? 1 : 0) : -1;
}

const char *scsi_io_kind_name(enum scsi_io_kind k)
{
	static const char *const n[] = { "read", "write", "other" };
	return k < SCSI_IO_KINDS ? n[k] : "?";
}

const char *scsi_outcome_name(enum scsi_outcome o)
{
	static const char *const n[] = { "hit", "partial", "miss", "bypass", "backing", "none" };
	return o < SCSI_OUTCOMES ? n[o] : "?";
}
