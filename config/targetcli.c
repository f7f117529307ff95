/*
 * targetcli.c - print targetcli commands for every configured LUN and target.
 *
 * One block per [lun] (the user:tiercache backstore, cfgstring = the LUN
 * name, so LIO's dev_config is "tiercache/NAME"), then one block per
 * [target]: the iSCSI target, its portals from [portal], its LUN mappings,
 * and access: an ACL per allowed initiator with CHAP on each, or, with no
 * allow list, demo mode (generate_node_acls) with CHAP on the TPG.
 */
#include "config/targetcli.h"

#include "config/config.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

/* Bytes of an existing backing store, or 0 when it cannot be known. */
static uint64_t backing_size(const char *path)
{
	struct stat st;
	if (stat(path, &st) < 0)
		return 0;
	if (S_ISREG(st.st_mode))
		return (uint64_t)st.st_size;
	if (!S_ISBLK(st.st_mode))
		return 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	uint64_t bytes = 0;
	if (fd >= 0) {
		if (ioctl(fd, BLKGETSIZE64, &bytes) < 0)
			bytes = 0;
		close(fd);
	}
	return bytes;
}


static void chap_args(FILE *out, const struct cfg_target *t)
{
	fprintf(out, "userid=%s password=%s", t->chap_user, t->chap_secret);
	if (t->mutual_user)
		fprintf(out, " mutual_userid=%s mutual_password=%s", t->mutual_user, t->mutual_secret);
}

int config_targetcli_script(const struct config *cfg, FILE *out, FILE *notes, char *err, size_t errlen)
{
	if (!cfg->tcmu_enable)
		fprintf(notes, "note: %s has no [tcmu] enable = yes; tiercached will not serve these backstores\n",
			cfg->path);
	for (int i = 0; i < cfg->nluns; i++) {
		const struct cfg_lun *l = &cfg->luns[i];
		uint64_t size = l->size ? l->size : backing_size(l->backing);
		if (!size) {
			snprintf(err, errlen, "%s:%d: [lun %s] gives no size and %s cannot be measured; add size = "
				 "or create the backing store first", cfg->path, l->line, l->name, l->backing);
			return -1;
		}
		char serial[33];
		fprintf(out, "/backstores/user:tiercache create name=%s size=%llu cfgstring=%s", l->name,
			(unsigned long long)size, l->name);
		if (config_lun_serial(cfg, l, false, serial) == 0)
			fprintf(out, " wwn=%s", serial);
		/* With tcmu-runner beside us ([tcmu] dbus), both daemons hear the
		 * kernel's "device added" and tcmu-runner answers "no handler"
		 * first as often as not: tell LIO not to wait for an answer. */
		const char *sep = " control=";
		if (l->block_size != 512) {
			fprintf(out, "%shw_block_size=%u", sep, l->block_size);
			sep = ",";
		}
		if (cfg->tcmu_dbus)
			fprintf(out, "%snl_reply_supported=-1", sep);
		fprintf(out, "\n");
		if (strcmp(l->serial, "auto") == 0 && config_lun_serial(cfg, l, false, serial) < 0)
			fprintf(notes, "note: [lun %s]: serial = auto and the daemon has not made it yet; LIO picks its own "
				"wwn (INQUIRY still shows ours)\n", l->name);
	}
	if (cfg->disc_chap_user) {
		/* LIO's discovery CHAP: one setting for all its targets */
		fprintf(out, "/iscsi set discovery_auth enable=1 userid=%s password=%s", cfg->disc_chap_user,
			cfg->disc_chap_secret);
		if (cfg->disc_mutual_user)
			fprintf(out, " mutual_userid=%s mutual_password=%s", cfg->disc_mutual_user,
				cfg->disc_mutual_secret);
		fprintf(out, "\n");
	}
	for (int i = 0; i < cfg->ntargets; i++) {
		const struct cfg_target *t = &cfg->targets[i];
		char tpg[300];
		snprintf(tpg, sizeof(tpg), "/iscsi/%s/tpg1", t->iqn);
		fprintf(out, "/iscsi create %s\n", t->iqn);
		/* targetcli adds 0.0.0.0:3260 to a new target; replace it with ours */
		fprintf(out, "%s/portals delete 0.0.0.0 3260\n", tpg);
		/* [tcmu] portal lines when given (tiercached's own portal then
		 * keeps [portal] listen), else the [portal] addresses */
		const struct cfg_listen *portals = cfg->ntcmu_portal ? cfg->tcmu_portal : cfg->listen;
		int nportals = cfg->ntcmu_portal ? cfg->ntcmu_portal : cfg->nlisten;
		for (int k = 0; k < nportals; k++)
			fprintf(out, "%s/portals create %s %u\n", tpg, portals[k].addr, portals[k].port);
		for (int j = 0; j < t->nluns; j++)
			fprintf(out, "%s/luns create /backstores/user:tiercache/%s lun=%llu\n", tpg, t->luns[j].lun_name,
				(unsigned long long)t->luns[j].lun);
		if (t->nallow) {
			fprintf(out, "%s set attribute generate_node_acls=0 authentication=%d\n", tpg, t->chap_user ? 1 : 0);
			for (int k = 0; k < t->nallow; k++) {
				fprintf(out, "%s/acls create %s\n", tpg, t->allow[k]);
				if (t->chap_user) {
					fprintf(out, "%s/acls/%s set auth ", tpg, t->allow[k]);
					chap_args(out, t);
					fprintf(out, "\n");
				}
			}
		} else {
			fprintf(out, "%s set attribute generate_node_acls=1 demo_mode_write_protect=0 cache_dynamic_acls=1 "
				"authentication=%d\n", tpg, t->chap_user ? 1 : 0);
			if (t->chap_user) {
				fprintf(out, "%s set auth ", tpg);
				chap_args(out, t);
				fprintf(out, "\n");
			}
		}
	}
	if (cfg->ntargets && !cfg->ntcmu_portal)
		fprintf(notes, "note: LIO now owns the [portal] addresses: set [tcmu] portal = ADDRESS:PORT for LIO and keep "
			"[portal] listen for tiercached's own portal on another address or port.\n");
	fprintf(out, "saveconfig\n");
	return 0;
}
