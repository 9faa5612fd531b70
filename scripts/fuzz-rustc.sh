#!/bin/sh
# RUSTC_WRAPPER of the fuzz build (`make fuzz-build`): libFuzzer's coverage
# instrumentation ($FUZZ_RUSTFLAGS) on Tern's own crates, the fuzz targets
# and the third-party parsers they drive (JSON, protobuf, the image
# decoders). Other crates (wasmtime and Cranelift among them) are compiled
# plainly: the fuzzers are after the parsers, not after them. Only the
# target's code is instrumented (cargo passes --target to it, as make does):
# what runs on the build machine (build scripts, proc macros and their
# dependencies) never is. The flags added here are not in cargo's
# fingerprints: after changing them, remove target/fuzz.
case " $* " in
  *" --crate-name build_script_"*|*" --crate-type proc-macro "*) exec "$@" ;;
  *" --target "*) ;;
  *) exec "$@" ;;
esac
case " $* " in
  *" --crate-name serde_json "*|*" --crate-name prost "*|*" --crate-name image "*|\
  *" --crate-name zune_jpeg "*|*" --crate-name zune_core "*|*" --crate-name image_webp "*|\
  *" --crate-name png "*) exec "$@" $FUZZ_RUSTFLAGS ;;
  *"/registry/src/"*|*"/git/checkouts/"*) exec "$@" ;;
  *" --crate-name "*) exec "$@" $FUZZ_RUSTFLAGS ;;
  *) exec "$@" ;;
esac
