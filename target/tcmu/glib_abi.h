/*
 * glib_abi.h - the four GLib main-context calls target/tcmu needs.
 *
 * Why: libtcmu's D-Bus registration (tcmulib_register, which makes
 * user:tiercache appear in targetcli and routes targetcli's CheckConfig to
 * our check_config) is asynchronous GDBus: its callbacks run only while
 * someone iterates GLib's default main context. libglib-2.0.so.0 is already
 * loaded as a dependency of libtcmu.so.2; Debian's runtime package
 * (libglib2.0-0) has no header, so these are declared here from GLib's
 * stable API (gmain.h, unchanged since GLib 2.0): gboolean is an int and
 * NULL means the global default context.
 */
#ifndef TC_TCMU_GLIB_ABI_H
#define TC_TCMU_GLIB_ABI_H

typedef int gboolean;
typedef struct _GMainContext GMainContext;

/* Run one iteration of context; may_block: wait for an event. Returns
 * whether an event was dispatched. Call from one thread per context. */
gboolean g_main_context_iteration(GMainContext *context, gboolean may_block);
/* Make a blocked g_main_context_iteration return; any thread. */
void g_main_context_wakeup(GMainContext *context);

#endif
