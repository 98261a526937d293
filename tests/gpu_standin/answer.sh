#!/bin/sh
# The front of a scripted stand-in (installed as `nvidia-smi` and `dmesg`, the script as NAME.script
# beside it): the script's answer to these arguments and this scenario, rendered once and kept.
#
# The scripts are Python, and a node's doctor probe calls them five times: each call's start-up
# (some 40 ms of CPU) is nothing on a real node but on the local fleet every node's calls share
# this machine's cores, which made the stand-ins, not the reader, most of the doctor's GPU cost.
# An answer depends only on the arguments, the script and the scenario file (a test rewrites it
# mid-run: their content is the key), so a kept one is the same bytes and exit code the script would give.
here=${0%/*}
name=${0##*/}
key=$( { printf '%s\n' "$name" "$@"; cat "$here/$name.script" "$here/gpu-standin.json" 2>/dev/null; } | cksum | tr ' ' '-')
kept="$here/.answers/$key"
if [ -f "$kept.rc" ]; then
    cat "$kept.out"
    cat "$kept.err" >&2
    exit "$(cat "$kept.rc")"
fi
mkdir -p "$here/.answers" 2>/dev/null
new="$kept.$$"
if ! : 2>/dev/null >"$new.out"; then
    exec python3 "$here/$name.script" "$@"  # a folder this user cannot write in: answer, keep nothing
fi
# Rendered and kept by a process of its own, which finishes even when the caller kills this one
# at its timeout (a loaded machine): the next call gets the answer kept.
(
    python3 "$here/$name.script" "$@" >"$new.out" 2>"$new.err"
    echo "$?" >"$new.rc"
    mv -f "$new.out" "$kept.out" && mv -f "$new.err" "$kept.err" && mv -f "$new.rc" "$kept.rc"
) </dev/null >/dev/null 2>&1 &
wait "$!"
cat "$kept.out"
cat "$kept.err" >&2
exit "$(cat "$kept.rc")"
