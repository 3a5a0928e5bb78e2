;; One page of memory that can never grow, and a trap: a trap, not a memory limit.
(module
  (memory (export "memory") 1 1)
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasmbox_call") (param i32 i32) (result i64) unreachable))
