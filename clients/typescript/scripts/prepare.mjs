// npm's prepare script: builds dist/src, what the package's main names, so
// that `npm install /path/to/clients/typescript` leaves an importable
// package.
//
// npm runs prepare for a folder dependency, but installs the folder's own
// devDependencies (the TypeScript compiler) only when the folder lies inside
// the installing project; from anywhere else it links the folder bare. So
// when the compiler cannot be found from here, it is installed first into the
// folder's node_modules, as package-lock.json pins it, the way npm prepares a
// git dependency.
import { execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import { dirname } from "node:path";
import { fileURLToPath } from "node:url";

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const require = createRequire(import.meta.url);

function compiler() {
  try {
    return require.resolve("typescript/bin/tsc");
  } catch {
    return undefined;
  }
}

function npm(...args) {
  // The install that runs this script passes its settings down in
  // npm_config_*: keep the cache and registry ones, not those saying where
  // to install or what to leave out.
  const env = { ...process.env };
  for (const name of ["prefix", "global", "location", "omit", "include", "production", "only", "ignore_scripts"]) {
    delete env[`npm_config_${name}`];
  }
  const cli = process.env.npm_execpath;
  const [file, argv] = cli ? [process.execPath, [cli, ...args]] : ["npm", args];
  execFileSync(file, argv, { cwd: root, env, stdio: "inherit" });
}

let tsc = compiler();
if (tsc === undefined) {
  console.error("limiter-client: installing the TypeScript compiler (npm ci) to build dist/");
  npm("ci", "--prefix", root, "--include=dev", "--ignore-scripts", "--no-audit", "--no-fund");
  tsc = compiler();
  if (tsc === undefined) {
    throw new Error(`typescript is still not installed in ${root}/node_modules after npm ci`);
  }
}
execFileSync(process.execPath, [tsc, "-p", "tsconfig.build.json"], { cwd: root, stdio: "inherit" });
