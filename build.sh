#!/usr/bin/env bash
# build.sh — the recipe.
#   ./build.sh          build ./moet (one translation unit: moet.c) and build/demo.planes (the
#                       bundled model's experts as 2-bit planes, what `moet serve` serves by default)
#   ./build.sh test     build ./moet, then build and run every tests/test_*.c; a table of checks per
#                       program, then the last line "N passed, M failed, K skipped" over all of them
#                       (each skip is named on stderr); exit status 0 only when M = 0
#   ./build.sh fuzz     build the libFuzzer targets tests/fuzz_*.c (clang, ASan + UBSan) and run
#                       each for FUZZ_SECONDS (default 60) on its corpus in build/corpus/<name>
#   ./build.sh test-gpu run the GPU tests (tests/test_gpu.c: the whole model on the GPU against the goldens
#                       and the CPU reference, batch invariance) on a machine with an NVIDIA GPU, and
#                       compute-sanitizer memcheck (a missing tool is a failure); the same last line
#   ./build.sh harness  every kernel against its CPU twin on Qwen3.6-35B-A3B's shapes, timed, on a
#                       machine with an NVIDIA GPU (tests/harness_kernels.c): a table line per kernel
#                       and shape (error and bound, µs, bytes, GB/s, % of the copy bandwidth); exit
#                       status 1 when an error is past its bound
#   ./build.sh mutate [N]  plant each bug of tests/mutations.txt (or the N-th) in a scratch copy and run
#                       the tests that cover it: every one must be caught (a tool, not part of CI)
#   ./build.sh cubins   rebuild the kernels' cubins and PTX (sass/moet.*) with nvcc, whatever the stamp says
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

# The kernels: sass/all.cu (every sass/*.cu) compiled by nvcc to one cubin per architecture and a
# PTX fallback (sass/moet.*), and so is sass/all_bf.cu, the products reading the activations' bf16
# rounding (sass/moet_bf.*). They are committed and embedded in ./moet by gpu/kernels.c (.incbin), so a machine
# with only the NVIDIA driver runs them and a machine with no CUDA toolkit still builds.
# sass/moet.stamp holds the SHA-256 of the sources and of `nvcc --version`: the images are rebuilt
# only when a source (or the compiler) changed, and only where nvcc is present.
NVCC=${NVCC:-nvcc}
SASS_ARCHS="90 120 121"
# -O3: device code at full optimisation; -cubin -arch=sm_XX: machine code for exactly that GPU
# (sm_90 H100/H200, sm_120 RTX 50xx / RTX PRO 6000, sm_121 GB10); -ptx -arch=compute_90: PTX the
# driver compiles for any other GPU of compute capability 9.0 or newer, kept without its comment
# lines and indentation (13 % of its bytes; check_cubins: ptxas makes the same machine code of both)
NVCC_FLAGS="-O3 -std=c++17"
PTX_KEEP='s/^[[:space:]]*//;s/[[:space:]]*$//;/^\/\//d;/^$/d'   # sed: what of nvcc's PTX is kept
sass_stamp() {
    { cat sass/*.cu sass/*.cuh sass/*.h; "$NVCC" --version; echo "$NVCC_FLAGS $SASS_ARCHS $(sass_arch 90) $PTX_KEEP"; } | sha256sum | cut -d' ' -f1
}
# sm_90's cubin is built for sm_90a (H100 / H200 exactly: their wgmma, sass/mm.cuh MMG_WG); the PTX
# fallback stays compute_90, without it
sass_arch() { if [ "$1" = 90 ]; then echo sm_90a; else echo "sm_$1"; fi; }
sass_compile() {   # into directory $1
    local out=$1 a pids=() rc=0
    mkdir -p "$out"
    mkdir -p build
    for img in moet:all moet_bf:all_bf; do   # image name : source (sass/all_bf.cu: the products reading bf16 activations)
        local name=${img%%:*} src=sass/${img#*:}.cu
        for a in $SASS_ARCHS; do
            "$NVCC" $NVCC_FLAGS -cubin -arch="$(sass_arch "$a")" -o "$out/$name.sm_$a.cubin" "$src" & pids+=($!)
        done
        { "$NVCC" $NVCC_FLAGS -ptx -arch=compute_90 -o "build/$name.compute_90.full.ptx" "$src" &&
            sed -e "$PTX_KEEP" "build/$name.compute_90.full.ptx" >"$out/$name.compute_90.ptx"; } &
        pids+=($!)
    done
    for a in "${pids[@]}"; do wait "$a" || rc=1; done
    return $rc
}
build_cubins() {
    if ! command -v "$NVCC" >/dev/null; then
        echo "build.sh: no nvcc: using the committed kernels in sass/" >&2
        return 0
    fi
    local stamp
    stamp=$(sass_stamp)
    if [ "${1:-}" != force ] && [ "$(cat sass/moet.stamp 2>/dev/null)" = "$stamp" ]; then return 0; fi
    echo "build.sh: compiling the kernels (nvcc)" >&2
    sass_compile sass
    echo "$stamp" > sass/moet.stamp
}
# ./build.sh test: the committed images must be exactly what the sources give (nvcc is deterministic)
check_cubins() {
    if ! command -v "$NVCC" >/dev/null; then
        echo "build.sh: no nvcc: the committed kernels were not rebuilt to compare" >&2
        return 0
    fi
    rm -rf build/sass-check
    sass_compile build/sass-check
    local f bad=0
    for f in build/sass-check/*; do
        if ! cmp -s "$f" "sass/$(basename "$f")"; then
            echo "build.sh: sass/$(basename "$f") differs from what the sources in sass/ give: run ./build.sh and commit it" >&2
            bad=1
        fi
    done
    # the kept PTX is nvcc's with comments and indentation dropped: the same machine code from both
    local ptxas
    ptxas="$(dirname "$(command -v "$NVCC")")/ptxas"
    if [ -x "$ptxas" ]; then
        for name in moet moet_bf; do
            "$ptxas" -arch=sm_90 -O3 -o build/sass-check/$name.full.cubin build/$name.compute_90.full.ptx &
            "$ptxas" -arch=sm_90 -O3 -o build/sass-check/$name.kept.cubin sass/$name.compute_90.ptx
            wait
            if ! cmp -s build/sass-check/$name.full.cubin build/sass-check/$name.kept.cubin; then
                echo "build.sh: sass/$name.compute_90.ptx does not compile to the machine code of nvcc's PTX" >&2
                bad=1
            fi
        done
    fi
    return $bad
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

# The result line of one test program: "name: N passed, M failed, K skipped" (", K skipped" may
# be missing). Prints "N M K", or nothing when there is no such line.
result_counts() {
    { grep -E '^[a-z_0-9]+: [0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?$' || true; } | tail -n 1 |
        sed -E 's/^[a-z_0-9]+: ([0-9]+) passed, ([0-9]+) failed(, ([0-9]+) skipped)?$/\1 \2 \4/' |
        awk '{ print $1, $2, ($3 == "" ? 0 : $3) }'
}

# Totals over the programs run so far, and the table of checks per program.
T_PASSED=0 T_FAILED=0 T_SKIPPED=0 T_TABLE=""
add_counts() {   # name passed failed skipped
    T_PASSED=$((T_PASSED + $2)); T_FAILED=$((T_FAILED + $3)); T_SKIPPED=$((T_SKIPPED + $4))
    T_TABLE+=$(printf '  %-44s %8d passed %3d failed %3d skipped' "$1" "$2" "$3" "$4")$'\n'
}
# The table, then last on stdout "N passed, M failed, K skipped"; status 0 only when M = 0.
report_totals() {
    printf 'checks per test program:\n%s' "$T_TABLE"
    echo "$T_PASSED passed, $T_FAILED failed, $T_SKIPPED skipped"
    [ "$T_FAILED" -eq 0 ]
}

# Runs the given test programs, each one's output to stderr, and adds up their result lines.
# "VAR=value:build/test_x" runs build/test_x with VAR set. A program without a result line, or
# one that exits non-zero with no failed check, counts as one failure.
run_tests() {
    local t out counts rc prog var p f k
    for t in "$@"; do
        var=""; prog=$t
        if [[ $t == *:* ]]; then var=${t%%:*}; prog=${t#*:}; fi
        [ -x "$prog" ] || continue
        echo "== $prog${var:+ ($var)}" >&2
        set +e
        out=$(env $var "$prog" 2>&1)
        rc=$?
        set -e
        printf '%s\n' "$out" >&2
        counts=$(printf '%s\n' "$out" | result_counts)
        if [ -z "$counts" ]; then
            echo "$prog: no result line (exit $rc): counted as 1 failure" >&2
            p=0 f=1 k=0
        else
            read -r p f k <<<"$counts"
            if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "$prog: exit $rc" >&2; fi
        fi
        add_counts "$(basename "$prog")${var:+ ($var)}" "$p" "$f" "$k"
    done
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

# The GPU tests: tests/test_gpu.c, the GPU backend in tests/test_backend.c's suite and the prefix
# cache's exactness on it in tests/test_prefix.c (under
# `./build.sh test` they say they did not run when there is no GPU; here a missing GPU is a
# failure, MOET_REQUIRE_GPU=1), and the end-to-end server tests with
# every `moet serve` on the GPU (MOET_E2E_BACKEND=gpu), and `moet run` against the goldens on the
# GPU (MOET_RUN_BACKEND=gpu).
run_gpu_tests() {
    mkdir -p build
    local t rc=0
    for t in test_gpu test_backend test_prefix test_serve_e2e test_forward; do
        $CC $CFLAGS -DMOET_TEST -DMOET_POISON -o "build/$t" "tests/$t.c" $LIBS || rc=1
    done
    [ $rc = 0 ] || return 1
    run_tests MOET_REQUIRE_GPU=1:build/test_gpu MOET_REQUIRE_GPU=1:build/test_backend MOET_REQUIRE_GPU=1:build/test_prefix \
        MOET_E2E_BACKEND=gpu:build/test_serve_e2e MOET_RUN_BACKEND=gpu:build/test_forward
    gpu_memcheck
    report_totals
}

# The kernel harness: built as a test (MOET_TEST: moet.c without main), without MOET_POISON (its
# CPU twins' engine is large and every buffer it reads is written first).
run_harness() {
    mkdir -p build
    $CC $CFLAGS -DMOET_TEST -o build/harness_kernels tests/harness_kernels.c $LIBS
    build/harness_kernels
}

# compute-sanitizer memcheck on short GPU runs: moet run (fp8 KV, plane experts, an 80-token
# prompt in a chunk of 64, the GPU's cut alignment, and its tail; bf16 KV, a 400-token prompt in chunks
# of 256, the prompt shapes of the products) and moet serve (bf16 KV, three
# requests in one batch); any error report fails. Its report (stdout) and the
# programs' output go to build/memcheck-*.log.
gpu_memcheck() {
    if ! command -v compute-sanitizer >/dev/null; then
        echo "build.sh: no compute-sanitizer on the PATH: the memcheck runs cannot run (a failure here)" >&2
        add_counts "memcheck (compute-sanitizer)" 0 1 0
        return 0
    fi
    local cs="compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20" ok=0 bad=0
    if $cs ./moet run --backend gpu --kv-dtype fp8 --model tests/fixtures/demo --planes build/demo.planes \
        --ids "1,5,9,200,17,33,4000,12,7,99,1000,2,3,4,5,6,$(seq -s, 100 163)" --greedy 6 --chunk 64 \
        >build/memcheck-run.log 2>&1; then ok=$((ok + 1)); else bad=$((bad + 1)); fi
    # a prompt step of 256 tokens: the prompt shapes of the products (k_mm_g, k_moe_up_g, k_moe_dn_g)
    if $cs ./moet run --backend gpu --kv-dtype bf16 --model tests/fixtures/demo --planes build/demo.planes \
        --ids "$(seq -s, 10 409)" --greedy 2 --chunk 256 >build/memcheck-prompt.log 2>&1; then ok=$((ok + 1)); else bad=$((bad + 1)); fi
    if printf '%s\n' '{"id":"a","messages":[{"role":"user","content":"What does os.path.join do?"}],"max_tokens":12,"seed":1}' \
        '{"id":"b","prompt":"def f(x):","max_tokens":8,"temperature":0,"logprobs":true,"top_logprobs":3}' \
        '{"id":"c","messages":[{"role":"user","content":"Explain zip."}],"max_tokens":10,"stream":true}' |
        $cs ./moet serve --backend gpu --max-num-seqs 3 --max-batch-tokens 66 >build/memcheck-serve.log 2>&1; then
        ok=$((ok + 1)); else bad=$((bad + 1)); fi
    grep -h "ERROR SUMMARY" build/memcheck-run.log build/memcheck-prompt.log build/memcheck-serve.log >&2 || true
    [ $bad = 0 ] || echo "build.sh: compute-sanitizer found errors (or a run failed): build/memcheck-*.log" >&2
    add_counts "memcheck (compute-sanitizer)" $ok $bad 0
}

# ./build.sh mutate [N|NAME]: the mutation run. Each entry of tests/mutations.txt plants one small
# bug in a scratch copy of the sources (build/mutate/), builds ./moet and the test programs it
# names from that copy (CPU only), runs them, and reports whether any failed (caught). A needle
# that is not found exactly once, a mutant that does not compile, are ERRORs; a survivor is a
# failure unless its entry shows it equivalent ("= why"). With N (1-based) or a name: that one.
MUTATE_SOURCES="moet.c arena format gpu"
mutate_read() {   # fills M_NAME M_TESTS M_NEEDLE M_REPL M_EQUIV from tests/mutations.txt
    M_NAME=() M_TESTS=() M_NEEDLE=() M_REPL=() M_EQUIV=()
    local line i=-1 has_n=0 has_r=0
    while IFS= read -r line || [ -n "$line" ]; do
        case "$line" in
            "@ "*)
                i=$((i + 1)) has_n=0 has_r=0
                M_NAME[i]=$(printf '%s' "${line#@ }" | sed -E 's/ *\|.*$//')
                M_TESTS[i]=$(printf '%s' "$line" | sed -E 's/^[^|]*\| *//')
                M_NEEDLE[i]="" M_REPL[i]="" M_EQUIV[i]="" ;;
            "- "*)
                if [ $has_n = 1 ]; then M_NEEDLE[i]+=$'\n'"${line#- }"; else M_NEEDLE[i]=${line#- }; has_n=1; fi ;;
            "+ "*|"+")
                [ "$line" = "+" ] && line="+ "
                if [ $has_r = 1 ]; then M_REPL[i]+=$'\n'"${line#+ }"; else M_REPL[i]=${line#+ }; has_r=1; fi ;;
            "= "*) M_EQUIV[i]=${line#= } ;;
        esac
    done < tests/mutations.txt
}
# Where the needle occurs: prints "count file" (file: the last one that holds it).
mutate_find() {   # needle, in the tree at $2
    local needle=$1 root=$2 f text rest count=0 where=""
    for f in $(cd "$root" && find $MUTATE_SOURCES -type f \( -name '*.c' -o -name '*.h' \) | sort); do
        text=$(cat "$root/$f"; printf x); text=${text%x}
        rest=${text//"$needle"/}
        if [ ${#rest} -ne ${#text} ]; then
            count=$((count + (${#text} - ${#rest}) / ${#needle}))
            where=$f
        fi
    done
    echo "$count $where"
}
mutate() {
    local only=${1:-} n i t0 t1 total=0 caught=0 survived=0 equiv=0 errors=0 results=""
    mutate_read
    n=${#M_NAME[@]}
    echo "mutate: ${n} mutations in tests/mutations.txt" >&2
    mkdir -p build
    t0=$(date +%s)
    for ((i = 0; i < n; i++)); do
        if [ -n "$only" ] && [ "$only" != "$((i + 1))" ] && [ "$only" != "${M_NAME[i]}" ]; then continue; fi
        total=$((total + 1))
        local tag="[$((i + 1))] ${M_NAME[i]}" verdict why="" found count file
        local dir=build/mutate
        rm -rf "$dir"; mkdir -p "$dir/tests" "$dir/build"
        cp -r $MUTATE_SOURCES sass "$dir/"
        cp tests/*.c tests/*.h "$dir/tests/"
        ln -s "$PWD/tests/fixtures" "$dir/tests/fixtures"
        [ -e "$DEMO_PLANES" ] && cp "$DEMO_PLANES" "$dir/build/"
        found=$(mutate_find "${M_NEEDLE[i]}" "$dir")
        count=${found%% *}; file=${found#* }
        if [ "$count" != 1 ]; then
            verdict=ERROR; why="the needle occurs $count times (want exactly once)"
        else
            local text
            text=$(cat "$dir/$file"; printf x); text=${text%x}
            printf '%s' "${text/"${M_NEEDLE[i]}"/"${M_REPL[i]}"}" > "$dir/$file"
            if ! (cd "$dir" && $CC $CFLAGS -o moet moet.c $LIBS) 2>"$dir/build.log"; then
                verdict=ERROR; why="the mutant does not compile (build/mutate/build.log)"
            else
                local tst failed_in="" rc
                for tst in ${M_TESTS[i]}; do
                    if ! (cd "$dir" && $CC $CFLAGS -DMOET_TEST -DMOET_POISON -o "build/$tst" "tests/$tst.c" $LIBS) 2>>"$dir/build.log"; then
                        verdict=ERROR; why="$tst does not compile against the mutant"; break
                    fi
                    set +e
                    (cd "$dir" && timeout "${MUTATE_TIMEOUT:-600}" "build/$tst") >"$dir/$tst.log" 2>&1
                    rc=$?
                    set -e
                    local counts
                    counts=$(result_counts < "$dir/$tst.log")
                    if [ $rc -ne 0 ] || [ -z "$counts" ] || [ "$(echo "$counts" | cut -d' ' -f2)" != 0 ]; then
                        failed_in+="${failed_in:+, }$tst"
                        if [ -n "$counts" ]; then failed_in+=" ($(echo "$counts" | cut -d' ' -f2) failed)"
                        else failed_in+=" (exit $rc)"; fi
                    fi
                done
                if [ "${verdict:-}" != ERROR ]; then
                    if [ -n "$failed_in" ]; then verdict=CAUGHT; why="by $failed_in"
                    elif [ -n "${M_EQUIV[i]}" ]; then verdict=EQUIVALENT; why="${M_EQUIV[i]}"
                    else verdict=SURVIVED; why="${M_TESTS[i]} all pass"; fi
                fi
            fi
        fi
        case $verdict in
            CAUGHT) caught=$((caught + 1)) ;;
            EQUIVALENT) equiv=$((equiv + 1)) ;;
            SURVIVED) survived=$((survived + 1)) ;;
            ERROR) errors=$((errors + 1)) ;;
        esac
        printf '%-10s %s: %s\n' "$verdict" "$tag" "$why" >&2
        results+=$(printf '%-10s %s: %s' "$verdict" "$tag" "$why")$'\n'
        unset verdict
    done
    t1=$(date +%s)
    rm -rf build/mutate
    printf '%s' "$results"
    echo "mutate: $caught of $total caught, $equiv equivalent, $survived survived, $errors errors ($((t1 - t0)) s)"
    [ $((survived + errors)) -eq 0 ]
}

case "${1:-}" in
    "") build_cubins && build_moet && build_demo_planes ;;
    test) build_cubins && build_moet && build_demo_planes && check_cubins && build_tests && run_tests build/test_* && report_totals ;;
    test-gpu) build_cubins && build_moet && build_demo_planes && run_gpu_tests ;;
    harness) build_cubins && run_harness ;;
    cubins) build_cubins force ;;
    fuzz) build_fuzz && run_fuzz ;;
    unicode) gen_unicode ;;
    mutate) build_cubins && build_moet && build_demo_planes && mutate "${2:-}" ;;
    *) echo "usage: ./build.sh [test|test-gpu|harness|mutate [N]|cubins|fuzz|unicode]" >&2; exit 2 ;;
esac
