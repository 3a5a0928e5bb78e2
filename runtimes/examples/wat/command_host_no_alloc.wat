;; A WASI command that imports a host function but exports wasmbox_alloc as a global, so
;; the host could not write a reply: must be refused at load.
(module
  (import "wasmbox" "host.fn" (func $host (param i32 i32) (result i64)))
  (memory (export "memory") 1)
  (global (export "wasmbox_alloc") i32 (i32.const 0))
  (func (export "_start") (drop (call $host (i32.const 0) (i32.const 0)))))
