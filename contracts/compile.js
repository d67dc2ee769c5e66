// Compiles a Solidity standard-JSON input (read from stdin) with the pinned solc-js and prints
// the standard-JSON output on stdout. Imports ("@openzeppelin/...") resolve from node_modules.
// Used by contracts/build.py; `npx solcjs --standard-json` prints a non-JSON line first, so
// this script calls solc.compile directly.
"use strict";
const fs = require("fs");
const path = require("path");
const solc = require("solc");

function findImports(importPath) {
  const candidates = [path.join(__dirname, "node_modules", importPath), path.join(__dirname, "src", importPath)];
  for (const file of candidates) {
    if (fs.existsSync(file)) return { contents: fs.readFileSync(file, "utf8") };
  }
  return { error: "not found: " + importPath };
}

const input = fs.readFileSync(0, "utf8");
process.stdout.write(solc.compile(input, { import: findImports }));
