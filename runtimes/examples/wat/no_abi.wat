;; Exports nothing a tool needs.
(module (func (export "hello")))
