;; Grows memory to 16 MiB, then asks poll_oneoff for (16 MiB / 48) all-zero clock
;; subscriptions; returns {"ok": <the errno>}.
(module
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasmbox_call") (param i32 i32) (result i64)
    (drop (memory.grow (i32.const 255)))
    (i32.store8 (i32.const 20) (call $poll (i32.const 0) (i32.const 0) (i32.const 349525) (i32.const 16)))
    (i32.store8 (i32.const 16) (i32.const 0x81))
    (i32.store8 (i32.const 17) (i32.const 0xa2))
    (i32.store8 (i32.const 18) (i32.const 0x6f))
    (i32.store8 (i32.const 19) (i32.const 0x6b))
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 5))))
