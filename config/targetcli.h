/*
 * targetcli.h - the config file, spoken as targetcli commands.
 *
 * Why: on hosts where the kernel's LIO target serves the fabric, tiercached
 * is its user:tiercache backstore handler (target/tcmu) and the LIO side
 * is configured with targetcli. The same tiercached.conf already says
 * which LUNs exist, how big they are, which targets map them, who may log
 * in and with which CHAP secrets; this module prints the targetcli
 * commands that build exactly that, so an admin pastes them or pipes them
 * into targetcli (`tierctl -c CONF targetcli | targetcli`).
 *
 * Computed from the config alone (plus the serial numbers that
 * `serial = auto` keeps in state_dir and the size of existing backing
 * stores when size is not given). Main thread of a tool; no daemon needed.
 */
#ifndef TC_CONFIG_TARGETCLI_H
#define TC_CONFIG_TARGETCLI_H

#include <stdio.h>

struct config;

/* Write the script to out: targetcli commands only (targetcli has no
 * comment syntax), so it can be piped in. Advice for the admin goes to
 * notes, one "note: ..." line each. Returns 0, or -1 with a sentence in
 * err (a LUN whose size cannot be known). */
int config_targetcli_script(const struct config *cfg, FILE *out, FILE *notes, char *err, size_t errlen);

#endif
