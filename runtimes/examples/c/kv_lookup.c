/* kv_lookup: looks a key up through the host function kv.get (wasmbox ABI v1 reactor).
 *
 * args:   {"key": str}
 * result: {"key": key, "value": str or nil}  when kv.get replies {"ok": value}
 *         the host's {"error": message}, unchanged, when kv.get fails
 * The manifest must grant host function "kv.get"; it is the module's only wasmbox import.
 */
#include "wasmbox.h"

WASMBOX_HOST_FUNCTION(kv_get, "kv.get");

static int kv_lookup(const wb_value *args, wb_writer *out) {
    static const char *const keys[] = { "key", NULL };
    wb_value key, bad, value;
    if (wb_unknown_key(args, keys, &bad)) {
        if (bad.type == WB_STR)
            return wb_error(out, "args: unexpected key \"%.*s\"", (int)bad.len,
                            (const char *)bad.data);
        return wb_error(out, "args: keys must be strings");
    }
    if (!wb_map_get(args, "key", &key)) return wb_error(out, "args: \"key\" is required");
    if (key.type != WB_STR) return wb_error(out, "args: \"key\" must be a string");

    wb_writer req = {0};
    wb_write_map(&req, 1);
    wb_write_cstr(&req, "key");
    wb_write_value(&req, &key);
    if (req.failed) return wb_error(out, "out of memory");
    wb_bytes reply = wb_call_host(kv_get, &req);
    wb_writer_free(&req);

    switch (wb_parse_reply(reply, &value)) {
    case WB_REPLY_ERROR:
        return wb_error_n(out, (const char *)value.data, value.len);
    case WB_REPLY_OK:
        if (value.type != WB_STR && value.type != WB_NIL)
            return wb_error(out, "kv.get returned something other than a string or nil");
        wb_write_map(out, 2);
        wb_write_cstr(out, "key");
        wb_write_value(out, &key);
        wb_write_cstr(out, "value");
        wb_write_value(out, &value);
        return 0;
    default:
        return wb_error(out, "kv.get sent a malformed reply");
    }
}

WASMBOX_TOOL(kv_lookup)
