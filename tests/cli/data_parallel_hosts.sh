#!/usr/bin/env bash
# Data parallelism past one machine: two "hosts", each a network namespace of its own joined
# by a veth pair, one rank on each. mpirun starts the second rank through a launcher that
# enters the other namespace (where a cluster would use ssh), and MPI may only use TCP over
# the veth. SFT (whole moments, ZeRO-1-sharded ones, ZeRO-2-sharded gradients) and PPO across the two hosts end with
# the same weights as two ranks on one machine. Needs root (network namespaces); elsewhere
# it says SKIP. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_data_parallel_hosts
rm -rf "$tmp" && mkdir -p "$tmp"
tmp=$(cd "$tmp" && pwd) # the launcher runs in other namespaces: absolute paths
model=tests/fixtures/models/tiny_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh

ns_a=marlhf_a_$$ ns_b=marlhf_b_$$
cleanup() { ip netns del "$ns_a" 2> /dev/null; ip netns del "$ns_b" 2> /dev/null; }
trap cleanup EXIT
if ! ip netns add "$ns_a" 2> /dev/null; then
    echo "SKIP two_hosts: cannot create network namespaces here (needs root and iproute2)"
    exit 0
fi
ip netns add "$ns_b" &&
    ip link add "veth_a$$" type veth peer name "veth_b$$" &&
    ip link set "veth_a$$" netns "$ns_a" && ip link set "veth_b$$" netns "$ns_b" &&
    ip -n "$ns_a" addr add 10.77.0.1/24 dev "veth_a$$" && ip -n "$ns_b" addr add 10.77.0.2/24 dev "veth_b$$" &&
    ip -n "$ns_a" link set "veth_a$$" up && ip -n "$ns_b" link set "veth_b$$" up &&
    ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up ||
    { fail two_hosts_network "could not set up the veth pair"; exit 1; }
# The launcher mpirun calls instead of ssh: `launcher HOST COMMAND...`.
cat > "$tmp/launcher" <<LAUNCHER
#!/bin/sh
host=\$1
shift
case \$host in
    10.77.0.1) exec ip netns exec $ns_a sh -c "\$*" ;;
    10.77.0.2) exec ip netns exec $ns_b sh -c "\$*" ;;
esac
echo "launcher: unknown host \$host" >&2
exit 1
LAUNCHER
chmod +x "$tmp/launcher"
mpi_test_environment
two_hosts() { # two_hosts COMMAND...: one rank on each host, TCP over the veth only
    ip netns exec "$ns_a" mpirun --mca plm_rsh_agent "$tmp/launcher" --host 10.77.0.1,10.77.0.2 -np 2 \
        --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 "$@"
}

# The ranks' lines alone: mpirun's own warnings (Open MPI's rsh launcher sometimes prints a
# harmless "setpgid ... Permission denied" when the launched child has already exec'd) go to
# stderr, shown only if the check fails.
where=$(two_hosts sh -c 'echo "$OMPI_COMM_WORLD_RANK $(ip -o -4 addr show | grep -o "10\.77\.0\.[12]")"' \
    2> "$tmp/where.err" | sort | tr '\n' ' ')
[ "$where" = "0 10.77.0.1 1 10.77.0.2 " ] && pass "two_hosts_one_rank_each ($where)" ||
    fail two_hosts_one_rank_each "$where $(tail -n 2 "$tmp/where.err" | tr '\n' ' ')"

sft=(--model "$model" --data "$data/sft.jsonl" --eval-data "$data/sft_eval.jsonl" --max-seq-len 32
     --per-device-train-batch-size 4 --learning-rate 3e-3 --num-train-epochs 2 --threads 1 --quiet)
two_hosts "$bin" sft "${sft[@]}" --output "$tmp/sft_hosts" 2> "$tmp/sft_hosts.err"
ranks 2 "$bin" sft "${sft[@]}" --output "$tmp/sft_local" 2> /dev/null
cmp -s "$tmp/sft_hosts/final/model.safetensors" "$tmp/sft_local/final/model.safetensors" &&
    pass two_hosts_sft_same_weights || fail two_hosts_sft_same_weights "$(tail -n 3 "$tmp/sft_hosts.err")"

two_hosts "$bin" sft "${sft[@]}" --zero-stage 1 --output "$tmp/zero_hosts" 2> "$tmp/zero_hosts.err"
ranks 2 "$bin" sft "${sft[@]}" --zero-stage 1 --output "$tmp/zero_local" 2> /dev/null
cmp -s "$tmp/zero_hosts/final/model.safetensors" "$tmp/zero_local/final/model.safetensors" &&
    pass two_hosts_sft_zero1_same_weights || fail two_hosts_sft_zero1_same_weights "$(tail -n 3 "$tmp/zero_hosts.err")"
# ZeRO-2: the per-layer gradient sums of each backward over TCP.
two_hosts "$bin" sft "${sft[@]}" --zero-stage 2 --output "$tmp/zero2_hosts" 2> "$tmp/zero2_hosts.err"
ranks 2 "$bin" sft "${sft[@]}" --zero-stage 2 --output "$tmp/zero2_local" 2> /dev/null
cmp -s "$tmp/zero2_hosts/final/model.safetensors" "$tmp/zero2_local/final/model.safetensors" &&
    pass two_hosts_sft_zero2_same_weights || fail two_hosts_sft_zero2_same_weights "$(tail -n 3 "$tmp/zero2_hosts.err")"
# ZeRO-3: each layer's weights gathered over TCP for every forward and backward.
two_hosts "$bin" sft "${sft[@]}" --zero-stage 3 --output "$tmp/zero3_hosts" 2> "$tmp/zero3_hosts.err"
cmp -s "$tmp/zero3_hosts/final/model.safetensors" "$tmp/sft_local/final/model.safetensors" &&
    pass two_hosts_sft_zero3_same_weights || fail two_hosts_sft_zero3_same_weights "$(tail -n 3 "$tmp/zero3_hosts.err")"

"$bin" rm --model "$model" --data "$data/pairs.jsonl" --max-seq-len 32 --per-device-train-batch-size 8 \
    --learning-rate 3e-3 --max-steps 6 --output "$tmp/rm" --quiet --threads 1 2> /dev/null
ppo=(--actor-model "$model" --reward-model "$tmp/rm/final" --prompts "$data/sft.jsonl" --eval-prompts "$data/sft_eval.jsonl"
     --eval-count 4 --rollout-batch-size 8 --generation-batch-size 8 --micro-batch-size 2 --max-new-tokens 10
     --max-iterations 3 --actor-learning-rate 1e-3 --critic-learning-rate 1e-3 --min-response-tokens 1 --threads 1 --quiet
     --termination-condition fixed --ngram 3 --whiten-advantages)
two_hosts "$bin" ppo "${ppo[@]}" --output "$tmp/ppo_hosts" 2> "$tmp/ppo_hosts.err"
ranks 2 "$bin" ppo "${ppo[@]}" --output "$tmp/ppo_local" 2> /dev/null
cmp -s "$tmp/ppo_hosts/final/actor/model.safetensors" "$tmp/ppo_local/final/actor/model.safetensors" &&
    cmp -s "$tmp/ppo_hosts/final/critic/model.safetensors" "$tmp/ppo_local/final/critic/model.safetensors" &&
    pass two_hosts_ppo_same_weights || fail two_hosts_ppo_same_weights "$(tail -n 3 "$tmp/ppo_hosts.err")"

[ "$failures" -eq 0 ]
