/*
 * leg_health.c - nvme_health_read() turned into the "device" object of a
 * leg in `tierctl status`: kind; for NVMe also model, serial, firmware,
 * and the SMART log (critical warning in words, temperature, percentage
 * used, spare and its threshold, media errors, power-on hours, unsafe
 * shutdowns) and whether the leg should be failed by the SMART rule.
 */
#include "daemon/leg_health.h"

#include "cache/nvme_health.h"

#include <json-c/json.h>

void leg_health_json(struct json_object *leg, const char *path)
{
	struct nvme_health h;
	struct json_object *o = json_object_new_object();

	nvme_health_read(path, &h);
	json_object_object_add(o, "kind", json_object_new_string(h.kind));
	if (h.ident_valid) {
		json_object_object_add(o, "model", json_object_new_string(h.model));
		json_object_object_add(o, "serial", json_object_new_string(h.serial));
		json_object_object_add(o, "firmware", json_object_new_string(h.firmware));
		json_object_object_add(o, "nsid", json_object_new_int64(h.nsid));
	}
	if (h.smart_valid) {
		char text[200], why[320];
		struct json_object *s = json_object_new_object();
		nvme_health_warning_text(h.critical_warning, text, sizeof(text));
		json_object_object_add(s, "critical_warning", json_object_new_string(text));
		json_object_object_add(s, "temperature_c", json_object_new_int(h.temperature_c));
		json_object_object_add(s, "percent_used", json_object_new_int(h.percent_used));
		json_object_object_add(s, "available_spare", json_object_new_int(h.available_spare));
		json_object_object_add(s, "spare_threshold", json_object_new_int(h.spare_threshold));
		json_object_object_add(s, "media_errors", json_object_new_int64((int64_t)h.media_errors));
		json_object_object_add(s, "power_on_hours", json_object_new_int64((int64_t)h.power_on_hours));
		json_object_object_add(s, "unsafe_shutdowns", json_object_new_int64((int64_t)h.unsafe_shutdowns));
		bool failing = nvme_health_failing(&h, why, sizeof(why));
		json_object_object_add(s, "verdict", json_object_new_string(failing ? why : "healthy"));
		json_object_object_add(o, "smart", s);
	}
	if (h.error[0])
		json_object_object_add(o, "error", json_object_new_string(h.error));
	json_object_object_add(leg, "device", o);
}
