/*
 * bdev.c - the generic part of the block device interface (bdev.h).
 */
#include "bdev/bdev.h"
#include "common/worker.h"

#include <stddef.h>

int64_t bdev_lba_status(struct bdev *dev, uint64_t offset, bool *mapped)
{
	if (!dev->ops->lba_status) {
		*mapped = true;
		return (int64_t)(dev->size - offset);
	}
	return dev->ops->lba_status(dev, offset, mapped);
}

int bdev_space(struct bdev *dev, struct bdev_space *out)
{
	*out = (struct bdev_space){ 0 };
	return dev->ops->space ? dev->ops->space(dev, out) : -ENOTSUP;
}

/* Requests waiting for memory on this worker, in order, through req->link. */
static __thread struct bdev_req *later_head, *later_tail;
static __thread struct worker_batch_end later_run_at;

static void later_run(struct worker_batch_end *b)
{
	struct bdev_req *req = later_head;

	(void)b;
	later_head = later_tail = NULL;
	while (req) {
		struct bdev_req *next = req->link;
		req->link = NULL;
		req->dev->ops->submit(req->dev, req); /* may queue it again */
		req = next;
	}
}

void bdev_submit_later(struct bdev *dev, struct bdev_req *req)
{
	req->dev = dev;
	req->link = NULL;
	if (later_tail)
		later_tail->link = req;
	else
		later_head = req;
	later_tail = req;
	later_run_at.fn = later_run;
	worker_at_batch_end(&later_run_at);
}
