#!/usr/bin/env bash
# build.sh — the recipe.
#   ./build.sh          build ./moet (one translation unit: moet.c) and build/demo.planes (the
#                       bundled model's experts as 2-bit planes, what `moet serve` serves by default)
#   ./build.sh test     build ./moet, then build and run every tests/test_*.c; the last line is
#                       "N passed, M failed" over all of them; exit status 0 only when M = 0
#   ./build.sh fuzz     build the libFuzzer targets tests/fuzz_*.c (clang, ASan + UBSan) and run
#                       each for FUZZ_SECONDS (default 60) on its corpus in build/corpus/<name>
#   ./build.sh unicode  regenerate format/unicode_tables.h (the tokenizer's Unicode properties and
#                       NFC tables) from the UCD of Debian's unicode-data package (/usr/share/unicode,
#                       or $UCD_DIR), and the NFC subset of its NormalizationTest.txt for the tests;
#                       both are committed, so normal builds and CI need no package
set -euo pipefail
cd "$(dirname "$0")"

CC=${CC:-cc}
# -std=c11: the language; _GNU_SOURCE (in moet.c) only for O_DIRECT, mmap flags, pthread naming
# -O2: the reference forward runs real matrix work even on the CPU
# -Wall -Wextra -Werror: warnings are bugs
# -Wno-unused-function: modules are libraries inside one file; a function the CLI does not
#                       call yet (but the tests do) is not an error
CFLAGS="-std=c11 -O2 -g -Wall -Wextra -Werror -Wno-unused-function -Wshadow -Wvla ${CFLAGS_EXTRA:-}"
# the only libraries: libcrypto (SHA-256), libdl (libcuda at run time), pthreads, libm
LIBS="-lcrypto -ldl -lpthread -lm"

build_moet() {
    $CC $CFLAGS -o moet moet.c $LIBS
}

# The bundled demo model's routed experts as a plane file: `moet serve` without --model serves
# from it. Rebuilt when missing or older than the checkpoint or the binary.
DEMO=tests/fixtures/demo
DEMO_PLANES=build/demo.planes
build_demo_planes() {
    mkdir -p build
    if [ ! -e "$DEMO_PLANES" ] || [ moet -nt "$DEMO_PLANES" ] || [ -n "$(find "$DEMO" -newer "$DEMO_PLANES" -name '*.safetensors')" ]; then
        ./moet build-planes --model "$DEMO" --out "$DEMO_PLANES" 2>/dev/null
    fi
}

build_tests() {
    mkdir -p build
    rm -f build/test_*   # a test that no longer compiles must not run from a stale binary
    local pids=() t rc=0
    for t in tests/test_*.c; do
        # MOET_TEST: moet.c without main(); MOET_POISON: fresh arenas filled with NaN bytes
        $CC $CFLAGS -DMOET_TEST -DMOET_POISON -o "build/$(basename "$t" .c)" "$t" $LIBS &
        pids+=($!)
        if (( ${#pids[@]} >= $(nproc) )); then wait "${pids[0]}" || rc=1; pids=("${pids[@]:1}"); fi
    done
    local p
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}

run_tests() {
    local passed=0 failed=0 t out line
    for t in build/test_*; do
        [ -x "$t" ] || continue
        echo "== $t" >&2
        set +e
        out=$("$t" 2>&1)
        local rc=$?
        set -e
        printf '%s\n' "$out" >&2
        line=$(printf '%s\n' "$out" | grep -E '^[a-z_0-9]+: [0-9]+ passed, [0-9]+ failed$' | tail -n 1 || true)
        if [ -z "$line" ]; then
            echo "$t: no result line (exit $rc): counted as 1 failure" >&2
            failed=$((failed + 1))
            continue
        fi
        local p f
        p=$(printf '%s' "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed/\1/')
        f=$(printf '%s' "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed/\2/')
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "$t: exit $rc" >&2; fi
        passed=$((passed + p))
        failed=$((failed + f))
    done
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}

build_fuzz() {
    mkdir -p build
    local t
    for t in tests/fuzz_*.c; do
        [ -e "$t" ] || continue
        clang -std=c11 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
            -DMOET_TEST -o "build/$(basename "$t" .c)" "$t" $LIBS
    done
}

run_fuzz() {
    local t name
    for t in build/fuzz_*; do
        [ -x "$t" ] || continue
        name=$(basename "$t")
        mkdir -p "build/corpus/$name"
        seeds="tests/fuzz_seeds/${name#fuzz_}"
        echo "== $name for ${FUZZ_SECONDS:-60}s" >&2
        # -artifact_prefix: crash / leak / timeout inputs go to build/ (ignored), not the repo root
        # -timeout=10: an input that takes 10 s is a hang, reported like a crash
        local flags=(-max_total_time="${FUZZ_SECONDS:-60}" -artifact_prefix="build/$name-" -timeout=10)
        if [ -d "$seeds" ]; then
            "$t" "${flags[@]}" "build/corpus/$name" "$seeds"
        else
            "$t" "${flags[@]}" "build/corpus/$name"
        fi
    done
}

# the generator is a separate host program, not part of moet.c; its output is deterministic
gen_unicode() {
    mkdir -p build
    $CC -std=c11 -O2 -Wall -Wextra -Werror -Wshadow -o build/gen_unicode format/gen_unicode.c
    build/gen_unicode "${UCD_DIR:-/usr/share/unicode}" > build/unicode_tables.h
    mv build/unicode_tables.h format/unicode_tables.h
    # the NFC lines of the UCD's own conformance test, for tests/test_tokenizer.c
    mkdir -p tests/fixtures/unicode
    bzcat "${UCD_DIR:-/usr/share/unicode}/NormalizationTest.txt.bz2" | build/gen_unicode --nfc-tests \
        > tests/fixtures/unicode/nfc_tests.txt
}

case "${1:-}" in
    "") build_moet && build_demo_planes ;;
    test) build_moet && build_demo_planes && build_tests && run_tests ;;
    fuzz) build_fuzz && run_fuzz ;;
    unicode) gen_unicode ;;
    *) echo "usage: ./build.sh [test|fuzz|unicode]" >&2; exit 2 ;;
esac
