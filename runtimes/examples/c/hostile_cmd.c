// wasmbox: command
/* hostile_cmd: a WASI command that tries what hostile_ops.h lists, for the hostile-guest suite
 * (tests/security). argv: hostile_cmd OP [ARG...]; the exit code is the operation's (0 done,
 * 1 refused with "error: <strerror>" on stdout, 2 bad usage).
 */
#include "hostile_ops.h"

int main(int argc, char **argv) {
    int rc = hostile_op(argc - 1, argv + 1);
    fflush(stdout);
    return rc;
}
