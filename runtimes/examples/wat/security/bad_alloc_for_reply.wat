;; Calls host function "host.fn", but its wasmbox_alloc answers a pointer past its memory, so
;; the host has nowhere to write the reply.
(module
  (import "wasmbox" "host.fn" (func $host (param i32 i32) (result i64)))
  (memory (export "memory") 1)
  (global $calls (mut i32) (i32.const 0))
  (data (i32.const 16) "\80")
  (func (export "wasmbox_alloc") (param i32) (result i32)
    ;; the first allocation (the args) is honest; later ones (replies) are not
    (global.set $calls (i32.add (global.get $calls) (i32.const 1)))
    (if (result i32) (i32.eq (global.get $calls) (i32.const 1))
      (then (i32.const 1024)) (else (i32.const 0xfffffff0))))
  (func (export "wasmbox_call") (param i32 i32) (result i64)
    (call $host (i32.const 16) (i32.const 1))))
