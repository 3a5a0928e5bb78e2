;; Returns {"ok": [[[[...null...]]]]} nested 100 deep: valid MessagePack, hostile shape.
(module
  (memory (export "memory") 1)
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasmbox_call") (param i32 i32) (result i64)
    (i32.store8 (i32.const 16) (i32.const 0x81))
    (i32.store8 (i32.const 17) (i32.const 0xa2))
    (i32.store8 (i32.const 18) (i32.const 0x6f))
    (i32.store8 (i32.const 19) (i32.const 0x6b))
    (memory.fill (i32.const 20) (i32.const 0x91) (i32.const 100))
    (i32.store8 (i32.const 120) (i32.const 0xc0))
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 105))))
