// Evaluated once, as a module, when the JavaScript runtime is built (before driver.js): QuickJS's
// own modules as globals, so a script (not a module) reaches them. Every call starts from this.
import * as std from "qjs:std";
import * as os from "qjs:os";

globalThis.std = std; // files through the manifest's preopens: std.loadFile, std.open, ...
globalThis.os = os; // os.readdir, os.stat, os.remove, ...; os.exec is not built for WASI
// (setTimeout and clearTimeout are the driver's, on os.setTimeout)
