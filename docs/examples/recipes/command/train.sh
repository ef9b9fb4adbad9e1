#!/usr/bin/env bash
# A trainer in bash that speaks the harness's line protocol itself (docs/recipes/command.md): one JSON
# line per call on the socket in $RESUME_CHECK_FD, one answer line back. Its "model" is an integer
# hash of the inputs it trained on, in order; its checkpoint is one line, written and renamed.
# Usage: train.sh OUT_DIR auto|path|disabled RESUME_FROM SHUFFLE
set -euo pipefail
out=$1 mode=$2 from=$3 shuffle=$4
inputs=12 batch=2 epochs=2
mkdir -p "$out"

call() {  # one request, one answer in REPLY; without the harness every call answers "false"
    if [[ -z "${RESUME_CHECK_FD:-}" ]]; then REPLY='{"ok": true, "value": false}'; return; fi
    printf '%s\n' "$1" >&"$RESUME_CHECK_FD"
    read -r REPLY <&"$RESUME_CHECK_FD"
}

step=0 epoch=0 pos=0 w=1 source="" newest=0
if [[ $mode == path ]]; then
    source=$from
elif [[ $mode == auto ]]; then
    for f in "$out"/step_*.ckpt; do
        [[ -e $f ]] || continue
        n=${f##*/step_}; n=${n%.ckpt}
        if (( n > newest )); then newest=$n source=$f; fi
    done
fi
if [[ -n $source ]]; then read -r step epoch pos w < "$source"; fi
if (( step > 0 )); then call "{\"call\": \"resumed\", \"step\": $step, \"path\": \"$source\"}"
else call '{"call": "resumed", "step": 0}'; fi

while (( epoch < epochs )); do
    ids=()
    for ((k = pos; k < pos + batch; k++)); do
        if (( shuffle )); then ids+=($(( (k * 5 + epoch * 7) % inputs ))); else ids+=("$k"); fi
    done
    step=$((step + 1))
    call "{\"call\": \"consumed\", \"step\": $step, \"epoch\": $epoch, \"ids\": [$(IFS=,; echo "${ids[*]}")]}"
    for i in "${ids[@]}"; do w=$(( (w * 31 + i + 1) % 1000003 )); done
    pos=$((pos + batch))
    if (( pos >= inputs )); then epoch=$((epoch + 1)) pos=0; fi
    call "{\"call\": \"step_end\", \"step\": $step}"
    call "{\"call\": \"should_checkpoint\", \"step\": $step}"
    if [[ $REPLY == *'"value": true'* ]]; then
        echo "$step $epoch $pos $w" > "$out/next.tmp"
        sync "$out/next.tmp"
        mv "$out/next.tmp" "$out/step_$step.ckpt"
        call "{\"call\": \"checkpoint_published\", \"step\": $step, \"path\": \"$out/step_$step.ckpt\"}"
    fi
    call "{\"call\": \"state\", \"step\": $step, \"components\": {\"w\": $w, \"position\": [$epoch, $pos]}}"
done
echo "trained $step steps, w=$w"
