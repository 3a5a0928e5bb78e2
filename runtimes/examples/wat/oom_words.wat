;; Returns {"error": "no such file: Out of memory.txt"}: words are not a memory limit.
(module
  (memory (export "memory") 1)
  (data (i32.const 16) "\81\a5error\d9\1fno such file: Out of memory.txt")
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasmbox_call") (param i32 i32) (result i64)
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 40))))
