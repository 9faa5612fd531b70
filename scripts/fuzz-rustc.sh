#!/bin/sh
# RUSTC_WRAPPER of the fuzz build (`make fuzz-build`): libFuzzer's coverage
# instrumentation ($FUZZ_RUSTFLAGS) on Tern's own crates and the fuzz
# targets only. Third-party crates (wasmtime and Cranelift among them) are
# compiled plainly: instrumenting them made a clean build ~19 min on 2
# cores, and the fuzzers are after Tern's code. Build scripts and proc
# macros run on the build machine and are never instrumented.
case " $* " in
  *" --crate-name build_script_"*|*" --crate-type proc-macro "*) exec "$@" ;;
  *"/.cargo/registry/"*|*"/.cargo/git/"*) exec "$@" ;;
  *" --crate-name "*) exec "$@" $FUZZ_RUSTFLAGS ;;
  *) exec "$@" ;;
esac
