#!/usr/bin/env bash
# scripts/acls.sh: the least-privilege ACLs of each binary, applied with Kafka's own AclCommand.
# docs/security.md explains every line; the secure tests (tests/security.rs) run the binaries with
# exactly these ACLs and with each one taken away.
#
# Usage:
#   scripts/acls.sh apply|remove|print ROLE [options]
#   scripts/acls.sh list [--principal User:NAME]
# ROLE: pipeline | sink | replay | tick-gen | verify | deliver
#   apply    add the role's ACLs (idempotent: an ACL that exists is left as it is)
#   remove   delete them (without asking)
#   print    show the AclCommand arguments that apply would run, and nothing else (no broker)
# Options (names default to the project's defaults; give the ones a deployment uses):
#   --principal User:NAME   whose ACLs (default: the role's SCRAM user of the local secured broker:
#                           User:pipeline, User:sink, User:replay, User:tools, User:deliver)
#   --app-id ID             pipeline/sink application id (default price-alerts)
#   --input TOPIC           ticks (default market-updates)
#   --output TOPIC          notifications (default notifications)
#   --dlq TOPIC             the pipeline's DLQ / the DLQ to replay (default <input>.dlq)
#   --target TOPIC          replay: the topic dead letters go back to (default <input>)
#   --dlq-gauges            pipeline: also Read on the DLQ and its ledger; deliver: on its DLQ,
#                           its parking lot and their ledgers; which the backlog gauges need when
#                           --metrics-addr is set
#   --skip ENTRY            leave one entry out (repeatable; `print` names the entries)
#   --only ENTRY            only this entry (repeatable)
#   --bootstrap HOST:PORT   default $KAFKA_SECURE_BOOTSTRAP, else 127.0.0.1:29094
#   --command-config FILE   Java client settings of a principal allowed to alter ACLs (default
#                           the super-user's of the local secured broker,
#                           .kafka/secure/clients/admin.properties)
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
ACL_CLASS=org.apache.kafka.tools.AclCommand

die() { printf 'acls.sh: error: %s\n' "$*" >&2; exit 2; }

verb=${1:-}
if [[ $verb == list ]]; then role=none; shift; else role=${2:-}; shift 2 2>/dev/null || shift $#; fi
[[ -n $verb && -n $role ]] || { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2; exit 2; }

principal='' app_id=price-alerts input=market-updates output=notifications dlq='' target='' gauges=0
bootstrap=${KAFKA_SECURE_BOOTSTRAP:-127.0.0.1:29094}
command_config=${KAFKA_SECURE_DIR:-$ROOT/.kafka/secure}/clients/admin.properties
skip=() only=()
while (($#)); do
  case $1 in
    --principal) principal=${2:?}; shift ;;
    --app-id) app_id=${2:?}; shift ;;
    --input) input=${2:?}; shift ;;
    --output) output=${2:?}; shift ;;
    --dlq) dlq=${2:?}; shift ;;
    --target) target=${2:?}; shift ;;
    --dlq-gauges) gauges=1 ;;
    --skip) skip+=("${2:?}"); shift ;;
    --only) only+=("${2:?}"); shift ;;
    --bootstrap) bootstrap=${2:?}; shift ;;
    --command-config) command_config=${2:?}; shift ;;
    *) die "unknown option '$1'" ;;
  esac
  shift
done
dlq=${dlq:-$input.dlq}
target=${target:-$input}

# The entries of a role, one a line: NAME OPERATION RESOURCE-TYPE RESOURCE-NAME PATTERN-TYPE.
# Write implies Describe, and Read implies Describe, on the same resource (Kafka's authorizer), so
# no Describe line is needed beside them. No IdempotentWrite on the cluster: since Kafka 3.0
# (KIP-679) Write on a topic or a transactional id implies it.
entries() {
  case $role in
    pipeline)
      echo "input-read Read topic $input literal"
      echo "group-read Read group $app_id literal"
      echo "changelog-read Read topic $app_id-state literal"
      echo "output-write Write topic $output literal"
      echo "dlq-write Write topic $dlq literal"
      echo "changelog-write Write topic $app_id-state literal"
      echo "txn-write Write transactional-id $app_id- prefixed"
      if ((gauges)); then
        echo "dlq-read Read topic $dlq literal"
        echo "ledger-read Read topic $dlq.replayed literal"
      fi
      ;;
    sink)
      echo "input-read Read topic $output literal"
      echo "group-read Read group $app_id-sink literal"
      ;;
    replay)
      echo "dlq-read Read topic $dlq literal"
      echo "ledger-read Read topic $dlq.replayed literal"
      echo "ledger-write Write topic $dlq.replayed literal"
      echo "ledger-create Create topic $dlq.replayed literal"
      echo "target-write Write topic $target literal"
      echo "txn-write Write transactional-id $dlq.replay literal"
      ;;
    tick-gen)
      echo "input-write Write topic $input literal"
      ;;
    verify)
      echo "input-read Read topic $input literal"
      echo "output-read Read topic $output literal"
      ;;
    deliver)
      # alert-deliver: its group <app>-deliver, its transactional ids <app>-deliver-<instance>,
      # its buckets <output>.retry.<delay> (src/cli/deliver.rs, src/deliver/buckets.rs), which it
      # creates with its DLQ and parking lot on its first start (the *-create entries: drop them
      # when an operator creates those topics beforehand).
      echo "input-read Read topic $output literal"
      echo "retry-read Read topic $output.retry. prefixed"
      echo "group-read Read group $app_id-deliver literal"
      echo "retry-write Write topic $output.retry. prefixed"
      echo "dlq-write Write topic $output.dlq literal"
      echo "parking-write Write topic $output.parking-lot literal"
      echo "txn-write Write transactional-id $app_id-deliver- prefixed"
      echo "retry-create Create topic $output.retry. prefixed"
      echo "dlq-create Create topic $output.dlq literal"
      echo "parking-create Create topic $output.parking-lot literal"
      if ((gauges)); then
        echo "dlq-read Read topic $output.dlq literal"
        echo "parking-read Read topic $output.parking-lot literal"
        echo "ledger-read Read topic $output.dlq.replayed literal"
        echo "parking-ledger-read Read topic $output.parking-lot.replayed literal"
      fi
      ;;
    *) die "unknown role '$role' (pipeline, sink, replay, tick-gen, verify, deliver)" ;;
  esac
}

default_principal() {
  case $role in
    pipeline | sink | replay | deliver) echo "User:$role" ;;
    *) echo "User:tools" ;;
  esac
}
explicit_principal=$principal
principal=${principal:-$(default_principal)}

selected() { # NAME
  local s
  for s in ${skip[@]+"${skip[@]}"}; do [[ $s == "$1" ]] && return 1; done
  ((${#only[@]} == 0)) && return 0
  for s in "${only[@]}"; do [[ $s == "$1" ]] && return 0; done
  return 1
}

# Entries with the same operation and pattern type go into one AclCommand call (each JVM start
# costs seconds); the calls run side by side.
declare -A groups=()
declare -a keys=()
known=()
if [[ $verb != list ]]; then
  while read -r name op type res pattern; do
    known+=("$name")
    selected "$name" || continue
    key="$op $pattern"
    [[ -n ${groups[$key]+x} ]] || keys+=("$key")
    groups[$key]+=" --$type $res"
  done < <(entries)
  for s in ${skip[@]+"${skip[@]}"} ${only[@]+"${only[@]}"}; do
    [[ " ${known[*]} " == *" $s "* ]] || die "no entry '$s' for role $role (entries: ${known[*]})"
  done
fi

admin_args() {
  [[ -r $command_config ]] || die "cannot read $command_config (scripts/kafka.sh up --secure makes it; or give --command-config)"
  printf '%s\n' --bootstrap-server "$bootstrap" --command-config "$command_config"
}

call_args() { # KEY -> the AclCommand arguments of one call, one per line
  local op=${1% *} pattern=${1#* }
  printf '%s\n' --allow-principal "$principal" --operation "$op" --resource-pattern-type "$pattern"
  # shellcheck disable=SC2086 # the resources are words by construction
  printf '%s\n' ${groups[$1]}
}

# One AclCommand call; its output (AclCommand reports errors on stdout) is shown only when it
# fails. Adding or removing an ACL that is already there or gone is a no-op, so a failed call is
# tried once more: on a loaded machine the admin client's first request may time out.
run_tool() {
  local out attempt
  for attempt in 1 2; do
    if out=$("$ROOT/scripts/kafka.sh" tool "$ACL_CLASS" "$@" 2>&1); then
      return 0
    fi
    printf 'acls.sh: AclCommand failed (attempt %d of 2):\n%s\n' "$attempt" "$out" >&2
  done
  return 1
}

case $verb in
  print)
    for key in ${keys[@]+"${keys[@]}"}; do
      mapfile -t a < <(call_args "$key")
      echo "--add ${a[*]}"
    done
    echo "# entries of $role: ${known[*]}"
    ;;
  apply | remove)
    mapfile -t base < <(admin_args)
    flag=--add
    [[ $verb == remove ]] && flag="--remove --force"
    pids=()
    for key in ${keys[@]+"${keys[@]}"}; do
      mapfile -t a < <(call_args "$key")
      # shellcheck disable=SC2086 # flag is one or two words
      run_tool "${base[@]}" $flag "${a[@]}" &
      pids+=($!)
    done
    rc=0
    for pid in ${pids[@]+"${pids[@]}"}; do wait "$pid" || rc=1; done
    ((rc == 0)) || die "AclCommand failed for role $role (its output is above)"
    ;;
  list)
    mapfile -t base < <(admin_args)
    args=(--list)
    [[ -n $explicit_principal ]] && args+=(--principal "$explicit_principal")
    exec "$ROOT/scripts/kafka.sh" tool "$ACL_CLASS" "${base[@]}" "${args[@]}"
    ;;
  *) die "unknown command '$verb' (apply, remove, print, list)" ;;
esac
