// Preloaded into jsii's Node process (NODE_OPTIONS=--require, set by stacks/cdk.py).
// The prebuilt google-beta provider's lib/index.js eagerly requires its ~1,600 resource
// modules (~2.7 s on this machine) although the stacks use a dozen: the Node-side twin of the
// Python package's __init__. For that one file, this hook defines each export as a getter
// that requires its module on first use. Any other layout is loaded as it is.
"use strict";
const Module = require("module");
const fs = require("fs");

const TARGET = /[\\/]provider-google-beta[\\/](?:.*[\\/])?lib[\\/]index\.js$/;
const EXPORT = /^exports\.(\w+) = require\("(\.\/[\w.-]+)"\);?$/gm;
const original = Module._extensions[".js"];

Module._extensions[".js"] = function lazyProviderIndex(module, filename) {
  if (!TARGET.test(filename)) {
    return original(module, filename);
  }
  const entries = [...fs.readFileSync(filename, "utf8").matchAll(EXPORT)];
  if (entries.length === 0) {
    return original(module, filename);
  }
  Object.defineProperty(module.exports, "__esModule", { value: true });
  for (const [, name, relative] of entries) {
    Object.defineProperty(module.exports, name, {
      enumerable: true,
      configurable: true,
      get() {
        const value = module.require(relative);
        Object.defineProperty(module.exports, name, { value, enumerable: true });
        return value;
      },
    });
  }
};
