;; Declares a second memory, to get past the per-call memory cap.
(module
  (memory (export "memory") 1)
  (memory $more 100)
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasmbox_call") (param i32 i32) (result i64) (i64.const 0)))
