/* hostile_core: a wasmbox ABI v1 reactor that tries what hostile_ops.h lists, for the
 * hostile-guest suite (tests/security).
 *
 * args:   {"op": [OP, ARG...]}  (strings)
 * result: the operation's code (0 done, 1 refused, 2 bad usage); what it printed is the
 *         call's stdout.
 */
#include "wasmbox.h"
#include "hostile_ops.h"

static int hostile(const wb_value *args, wb_writer *out) {
    wb_value op, item;
    if (!wb_map_get(args, "op", &op) || op.type != WB_ARRAY || op.len == 0 || op.len > 16)
        return wb_error(out, "args: \"op\" must be a list of 1 to 16 strings");
    char *argv[17] = {0};
    int argc = 0;
    wb_iter it = wb_items(&op);
    while (wb_next(&it, &item)) {
        if (!(argv[argc] = wb_cstr(&item))) return wb_error(out, "args: \"op\" must hold strings");
        argc++;
    }
    int rc = hostile_op(argc, argv);
    for (int i = 0; i < argc; i++) free(argv[i]);
    wb_write_int(out, rc);
    return 0;
}

WASMBOX_TOOL(hostile)
