#!/usr/bin/env bash
# scripts/kafka.sh: runs a real single-node Apache Kafka (KRaft, broker and controller in one JVM)
# on this machine without Docker, for the tests, the benchmarks and local runs of the pipeline.
# Kafka's own jars (the version pinned in scripts/kafka/pom.xml) are fetched from Maven Central
# with Maven; nothing is installed outside the repository.
#
# Usage:
#   scripts/kafka.sh up               start the broker (or reuse one already answering), wait until
#                                     it answers metadata requests
#   scripts/kafka.sh down [--wipe]    stop the broker that `up` started; --wipe also deletes its data
#   scripts/kafka.sh status           is our broker running, does anything answer at KAFKA_BOOTSTRAP
#                                     (exit 0 if something answers, 1 if not)
#   scripts/kafka.sh logs [-f] [N]    last N (default 100) lines of the broker log; -f follows it
#   scripts/kafka.sh classpath        print the Java classpath of Kafka's jars (fetching them if
#                                     needed); its first entry, scripts/kafka/, holds the
#                                     log4j2.properties that keeps tools at WARN on stderr; e.g.
#                                       java -cp "$(scripts/kafka.sh classpath)" \
#                                         org.apache.kafka.tools.ProducerPerformance ...
#   scripts/kafka.sh tool CLASS ARGS  run one of Kafka's Java tools with that classpath, e.g.
#                                       scripts/kafka.sh tool org.apache.kafka.tools.TopicCommand \
#                                         --bootstrap-server 127.0.0.1:9092 --list
#
# A local multi-broker KRaft cluster for chaos and failover (scripts/kafka/cluster.sh has the
# details: replication 3, min.insync.replicas 2, state in .kafka/cluster/, ports 19092.. and
# controllers 19192..), beside the single broker:
#   scripts/kafka.sh up --brokers 3   start the 3 brokers in parallel (or reuse them), wait until
#                                     all are registered; KAFKA_BROKERS=3 does the same
#   scripts/kafka.sh down|status|logs --brokers 3   as above, for the cluster (`logs --broker K`
#                                     for one broker's log)
#   scripts/kafka.sh broker K start|stop|kill|status|pid
#                                     one broker of the cluster: stop is SIGTERM (a controlled
#                                     shutdown), kill is SIGKILL; start waits until K is registered
#
# A local SECURED broker (scripts/kafka/secure.sh has the details: SASL_SSL with SCRAM-SHA-512 on
# 127.0.0.1:29094, OAUTHBEARER with OIDC tokens on 127.0.0.1:29095, TLS certificates made with
# openssl, the StandardAuthorizer, SCRAM users and OIDC client ids per binary; state,
# certificates, passwords and the token signing key in .kafka/secure/), beside the others:
#   scripts/kafka.sh up|down [--wipe]|status|logs --secure
#   scripts/kafka.sh env --secure     print KAFKA_SECURE_BOOTSTRAP, KAFKA_SECURE_DIR,
#                                     KAFKA_SECURE_CA and the KAFKA_SECURE_OAUTH_* of the OAUTHBEARER
#                                     listener as shell exports (no secret)
#   scripts/kafka.sh password --secure USER   print USER's password (the only command that does)
#   scripts/acls.sh                   the least-privilege ACLs of each binary (docs/security.md)
#
# All state lives in .kafka/ at the repository's top (git-ignored):
#   .kafka/jars/              the jars; .kafka/jars/.stamp holds the hash of pom.xml they came from,
#                             so a change to the pom fetches them again
#   .kafka/data/              the KRaft log dirs (kept across down/up; `down --wipe` deletes them)
#   .kafka/server.properties  generated on every `up`
#   .kafka/broker.log         the broker's stdout/stderr (the previous run's is kept as broker.log.1)
#   .kafka/gc.log             the broker JVM's pauses (GC and safepoints), wall-clock stamped
#   .kafka/broker.pid         the pid of the broker `up` started
#   .kafka/mvn.log, .kafka/format.log   output of the last jar fetch and storage format
#   .kafka/probe-admin.properties       short timeouts for the admin-client readiness probe
#   .kafka/cds/               one class-data archive per Kafka tool class, written by its first
#                             `tool` run (see tool_jvm); safe to delete
#
# Environment variables read:
#   KAFKA_PORT                 client (PLAINTEXT) port of the broker started here; default 9092
#   KAFKA_CONTROLLER_PORT      KRaft controller port of the broker started here; default KAFKA_PORT+1
#   KAFKA_BOOTSTRAP            where `up` and `status` look for a broker that already answers;
#                              default 127.0.0.1:KAFKA_PORT (the first host:port of a list is used)
#   KAFKA_AUTO_CREATE_TOPICS   auto.create.topics.enable of the broker; default false, so the code
#                              under test must create its topics itself
#   KAFKA_EXTRA_PROPERTIES     lines appended to the single broker's server.properties (a later
#                              key wins), for an experiment: e.g. the consumer group protocol's
#                              heartbeat, "group.consumer.heartbeat.interval.ms=1000" and
#                              "group.consumer.min.heartbeat.interval.ms=1000" (bench/RESULTS.md
#                              section 18); default none
#   KAFKA_START_TIMEOUT        seconds `up` waits for the broker to answer; default 150 (after an
#                              unclean stop a broker registers only after about 60 s)
#   KAFKA_STOP_TIMEOUT         seconds `down` waits after SIGTERM before SIGKILL; default 30
#   KAFKA_HEAP_OPTS            broker heap options; default "-Xms512m -Xmx1g"
#   KAFKA_JVM_OPTS             extra JVM options for the broker; default none
#   KAFKA_TOOL_OPTS            JVM options for `tool`; default "-XX:TieredStopAtLevel=1
#                              -XX:+UseSerialGC -XX:CICompilerCount=1": a tool runs for seconds,
#                              and C1 alone with one GC thread halves its CPU time (AclCommand:
#                              5.3 s -> 2.6 s of user time), which two cores shared with brokers
#                              and tests feel; a long-running tool (a benchmark) wants it empty
#   KAFKA_TOOL_SLOTS           how many `tool` JVMs of this checkout run at once (default 2, the
#                              cores of the machines here; 0: no bound); the others wait their
#                              turn (see tool_slot)
#   KAFKA_NOFILE               open-file limit (ulimit -n) every broker started here gets; default
#                              100000 (see raise_open_files)
#   KAFKA_WIPE                 1: `down` deletes .kafka/data as with --wipe
#   KAFKA_LOG_ROOT             where the brokers keep their KRaft log dirs instead of .kafka/
#                              (data/, cluster/broker-N/data/, secure/data/); scripts/test.sh
#                              points it at a tmpfs, so that no broker waits on a disk busy
#                              with the build's writeback
#   JAVA                       the java binary; default the `java` found on PATH (Java 17 or newer)
#   MVN                        the Maven binary; default the `mvn` found on PATH (only needed while
#                              the jars are not fetched yet)
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd -P)
POM="$SCRIPT_DIR/kafka/pom.xml"
# The folder holding log4j2.properties; first on the classpath so Kafka's tools find it by itself.
LOG_CONF_DIR="$SCRIPT_DIR/kafka"
STATE="$ROOT/.kafka"
JARS="$STATE/jars"
# Where the brokers' log dirs live (KAFKA_LOG_ROOT; default .kafka): scripts/test.sh puts them on
# a tmpfs, so that a broker's fsyncs never queue behind the build's writeback.
LOG_ROOT=${KAFKA_LOG_ROOT:-$STATE}
DATA="$LOG_ROOT/data"
PROPS="$STATE/server.properties"
LOG="$STATE/broker.log"
PIDFILE="$STATE/broker.pid"

KAFKA_PORT=${KAFKA_PORT:-9092}
KAFKA_CONTROLLER_PORT=${KAFKA_CONTROLLER_PORT:-$((KAFKA_PORT + 1))}
KAFKA_BOOTSTRAP=${KAFKA_BOOTSTRAP:-127.0.0.1:$KAFKA_PORT}
KAFKA_AUTO_CREATE_TOPICS=${KAFKA_AUTO_CREATE_TOPICS:-false}
KAFKA_START_TIMEOUT=${KAFKA_START_TIMEOUT:-150}
KAFKA_STOP_TIMEOUT=${KAFKA_STOP_TIMEOUT:-30}
KAFKA_HEAP_OPTS=${KAFKA_HEAP_OPTS:--Xms512m -Xmx1g}
KAFKA_JVM_OPTS=${KAFKA_JVM_OPTS:-}
KAFKA_TOOL_OPTS=${KAFKA_TOOL_OPTS--XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1}
# Every JVM here but a broker's: `tool`, the storage tool, the readiness probes.
TOOL_JVM=()
[[ -z $KAFKA_TOOL_OPTS ]] || read -r -a TOOL_JVM <<<"$KAFKA_TOOL_OPTS"
KAFKA_NOFILE=${KAFKA_NOFILE:-100000}
KAFKA_WIPE=${KAFKA_WIPE:-0}
KAFKA_BROKERS=${KAFKA_BROKERS:-1}
JAVA=${JAVA:-java}
MVN=${MVN:-mvn}

# The main classes used (checked against the 4.4.0 jars).
BROKER_CLASS=kafka.Kafka
STORAGE_TOOL_CLASS=kafka.tools.StorageTool
TOPIC_TOOL_CLASS=org.apache.kafka.tools.TopicCommand

log() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() { printf 'kafka.sh: error: %s\n' "$*" >&2; exit 1; }

now_ms() {
  local t
  t=$(date +%s%N 2>/dev/null || true)
  if [[ $t =~ ^[0-9]+$ && ${#t} -gt 12 ]]; then echo $((t / 1000000)); else echo $(($(date +%s) * 1000)); fi
}
elapsed() { # elapsed START_MS -> "12.3 s"
  local ms=$(($(now_ms) - $1))
  printf '%d.%d s' $((ms / 1000)) $((ms % 1000 / 100))
}

# ---------------------------------------------------------------------------------------------
# Tools and jars

need_java() {
  command -v "$JAVA" >/dev/null 2>&1 \
    || die "java not found: install a Java 17+ runtime (e.g. apt-get install openjdk-17-jre-headless) or set JAVA"
  local version major
  version=$("$JAVA" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n 1) || true
  major=${version%%.*}
  if [[ $major == 1 ]]; then major=$(echo "$version" | cut -d. -f2); fi
  if [[ $major =~ ^[0-9]+$ ]] && ((major < 17)); then
    die "Kafka 4 needs Java 17 or newer, $JAVA is $version: install openjdk-17-jre-headless or set JAVA"
  fi
}

need_mvn() {
  command -v "$MVN" >/dev/null 2>&1 \
    || die "mvn not found: install Maven 3.6+ (e.g. apt-get install maven) or set MVN; it fetches Kafka's jars once"
}

pom_hash() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$POM" | cut -d' ' -f1
  else
    shasum -a 256 "$POM" | cut -d' ' -f1
  fi
}

jars_ready() {
  [[ -f $JARS/.stamp ]] && [[ "$(cat "$JARS/.stamp")" == "$(pom_hash)" ]]
}

# Fetch the jars unless those of the current pom.xml are all there. Maven copies into a fresh
# folder that replaces .kafka/jars only once complete, so an interrupted fetch is redone next time.
ensure_jars() {
  jars_ready && return 0
  lock_state # one fetch at a time; another may have finished while we waited
  jars_ready && return 0
  need_mvn
  mkdir -p "$STATE"
  local tmp="$STATE/jars.tmp.$$" start
  start=$(now_ms)
  rm -rf "$tmp"
  log "fetching Kafka's jars with Maven (once; cached in .kafka/jars) ..."
  if ! "$MVN" -q -B -f "$POM" dependency:copy-dependencies \
    -DoutputDirectory="$tmp" -DincludeScope=runtime >"$STATE/mvn.log" 2>&1; then
    rm -rf "$tmp"
    tail -n 40 "$STATE/mvn.log" >&2
    die "mvn could not fetch Kafka's jars (output above and in .kafka/mvn.log; is Maven Central reachable?)"
  fi
  if ! compgen -G "$tmp/kafka_2.13-*.jar" >/dev/null || ! compgen -G "$tmp/kafka-tools-*.jar" >/dev/null; then
    rm -rf "$tmp"
    die "mvn finished but kafka_2.13 or kafka-tools jar is missing from its output"
  fi
  pom_hash >"$tmp/.stamp"
  rm -rf "$JARS"
  mv "$tmp" "$JARS"
  log "fetched $(find "$JARS" -name '*.jar' | wc -l) jars in $(elapsed "$start")"
}

classpath() {
  printf '%s:%s\n' "$LOG_CONF_DIR" "$(jars_classpath)"
}

# The jars alone, ':'-separated.
jars_classpath() {
  local cp= jar
  for jar in "$JARS"/*.jar; do cp+="${cp:+:}$jar"; done
  printf '%s\n' "$cp"
}

# Every JVM here but a broker's (`tool`, the storage tool, the readiness probes) starts with
# TOOL_CMD: java, KAFKA_TOOL_OPTS, the log4j2 file and the jars. Each start loads a few thousand
# classes of the jars, most of a short tool's CPU, and the secure tests start hundreds of them
# beside the brokers. An application class-data-sharing archive (AppCDS) of the classes a tool
# loads is mapped at start instead of parsed and verified: with it, TopicCommand --list took
# 0.7 s of CPU instead of 1.3 s (wall 0.5 s instead of 1.0 s), and `scripts/acls.sh apply
# pipeline` (four AclCommand JVMs side by side) 3.4 s instead of 5.8 s (wall 1.9 s instead of
# 3.1 s; medians of 3 interleaved runs, JDK 17, 2 cores, 2026-12-03). The first `tool` run of a
# class writes that class's archive (-XX:ArchiveClassesAtExit, to a file of its own renamed into
# place, so that runs side by side never share a half-written one); later JVMs of that class map
# it. Its name hashes the java binary, the options and the classpath, so new jars or another JDK
# get a new one; a stale or damaged archive only makes the JVM load its classes the usual way (its
# cds warnings are switched off: they would go to stdout, the tools' output). The log4j2 file is
# named by a property, not found through the classpath: AppCDS refuses a classpath holding a
# non-empty folder.
tool_jvm() { # CLASS [--dump]: sets TOOL_CMD, and TOOL_ARCHIVE when this run writes the archive
  local cp java key
  cp=$(jars_classpath)
  java=$(command -v "$JAVA") || java=$JAVA
  key=$(printf '%s\n' "$java" "$(stat -Lc %Y "$java" 2>/dev/null)" "${TOOL_JVM[*]:-}" "$cp" | cksum | cut -d' ' -f1)
  local jsa="$STATE/cds/${1##*.}-$key.jsa"
  TOOL_CMD=("$JAVA" ${TOOL_JVM[@]+"${TOOL_JVM[@]}"} -Dlog4j2.configurationFile="$LOG_CONF_DIR/log4j2.properties")
  TOOL_ARCHIVE=
  if [[ -s $jsa ]]; then
    TOOL_CMD+=(-XX:SharedArchiveFile="$jsa" '-Xlog:cds*=off')
  elif [[ ${2:-} == --dump ]] && mkdir -p "$STATE/cds" 2>/dev/null; then
    TOOL_ARCHIVE=$jsa
    TOOL_CMD+=(-XX:ArchiveClassesAtExit="$jsa.$$" '-Xlog:cds*=off')
  fi
  TOOL_CMD+=(-cp "$cp")
}

# ---------------------------------------------------------------------------------------------
# Probes

bootstrap_host() { local first=${KAFKA_BOOTSTRAP%%,*}; echo "${first%:*}"; }
bootstrap_port() { local first=${KAFKA_BOOTSTRAP%%,*}; echo "${first##*:}"; }

# Is a TCP port open? (bash's /dev/tcp; no JVM)
port_open() { # HOST PORT
  # shellcheck disable=SC2016 # $1 and $2 are expanded by the inner bash
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

# Which brokers does the Kafka broker at HOST PORT list as live? Sends Metadata v4 (api key 3;
# within what every Kafka 2.x-4.x broker supports) for no topics in particular and prints the node
# ids of the brokers array of the response, space-separated: a fenced or still starting broker
# lists none (in KRaft the array holds the registered, unfenced brokers only). Pure bash, about
# 10 ms, so readiness loops need no JVM per attempt.
# Returns 0: answers, ids printed; 3: a Kafka broker that lists no live broker yet; 2: not Kafka
# (an answer that is not Kafka's, or no answer in 3 s); 4: the connection failed or was closed
# without an answer (also what a Kafka broker that no longer supports v4 would do).
metadata_broker_ids() { # HOST PORT
  local out rc=0
  # shellcheck disable=SC2016 # $1 and $2 are expanded by the inner bash
  # size=20 | api_key=3 | version=4 | correlation_id=1 | client_id="probe" | topics=[] | auto_create=false
  # No topics (an empty array; null would be all of them), so the answer stays small whatever the
  # broker holds. It is read as its 4-byte size, then that many bytes (head -c never reads past N).
  out=$(timeout 3 bash -c '
      exec 3<>"/dev/tcp/$1/$2" || exit 1
      printf "\x00\x00\x00\x14\x00\x03\x00\x04\x00\x00\x00\x01\x00\x05probe\x00\x00\x00\x00\x00" >&3
      read -r -a s <<<"$(head -c 4 <&3 | od -An -tu1 -v)"
      ((${#s[@]} == 4)) || exit 0
      n=$(((s[0] << 24) | (s[1] << 16) | (s[2] << 8) | s[3]))
      ((n >= 12 && n <= 65536)) || { echo 0 0 0 0; exit 0; }
      head -c "$n" <&3 | od -An -tu1 -v
    ' _ "$1" "$2" 2>/dev/null) || rc=$?
  ((rc == 124)) && return 2
  local -a b
  read -r -a b <<<"$(echo "$out" | tr -s ' \n' '  ')"
  ((${#b[@]} == 0)) && return 4
  ((${#b[@]} >= 12)) || return 2
  # bytes 0..3: correlation id (must be 1); 4..7: throttle time; 8..11: number of live brokers,
  # then per broker: node_id int32, host (int16 length + bytes), port int32, rack (int16 length,
  # -1 for none, + bytes).
  ((b[0] == 0 && b[1] == 0 && b[2] == 0 && b[3] == 1)) || return 2
  local count=$(((b[8] << 24) | (b[9] << 16) | (b[10] << 8) | b[11])) i=12 k len
  ((count > 0)) || return 3
  local -a ids=()
  for ((k = 0; k < count; k++)); do
    ((i + 6 <= ${#b[@]})) || return 2
    ids+=($(((b[i] << 24) | (b[i + 1] << 16) | (b[i + 2] << 8) | b[i + 3])))
    len=$(((b[i + 4] << 8) | b[i + 5]))
    i=$((i + 6 + len + 4))
    ((i + 2 <= ${#b[@]})) || return 2
    len=$(((b[i] << 8) | b[i + 1]))
    ((len == 65535)) && len=0
    i=$((i + 2 + len))
  done
  echo "${ids[*]}"
}

# Does a Kafka broker answer a Metadata request with at least one live broker? The return codes
# of metadata_broker_ids, without printing.
kafka_metadata_ok() { # HOST PORT
  metadata_broker_ids "$1" "$2" >/dev/null
}

# The real check with Kafka's own admin client: list topics (a metadata round trip).
kafka_tool_ok() { # HOST:PORT
  jars_ready && command -v "$JAVA" >/dev/null 2>&1 || return 1
  # Short admin-client timeouts: a probe must fail in seconds, not after the default 60 s.
  printf '%s\n' request.timeout.ms=5000 default.api.timeout.ms=8000 socket.connection.setup.timeout.max.ms=5000 \
    >"$STATE/probe-admin.properties"
  tool_jvm "$TOPIC_TOOL_CLASS"
  timeout 15 "${TOOL_CMD[@]}" "$TOPIC_TOOL_CLASS" --bootstrap-server "$1" \
    --command-config "$STATE/probe-admin.properties" --list >/dev/null 2>&1
}

# 0: a Kafka broker answers at HOST PORT. 1: nothing listens. 2: something listens but does not
# answer as a Kafka broker. 3: a Kafka broker answers but lists no live broker (still starting).
answers() { # HOST PORT
  port_open "$1" "$2" || return 1
  local rc=0
  kafka_metadata_ok "$1" "$2" || rc=$?
  case $rc in
    0 | 2 | 3) return "$rc" ;;
  esac
  # Closed without an answer: maybe a broker that refuses the raw probe; ask Kafka's own tool.
  kafka_tool_ok "$1:$2" && return 0
  return 2
}

# ---------------------------------------------------------------------------------------------
# Our broker process

# Is PID our broker (java running kafka.Kafka with this repository's server.properties, or with
# PROPS: a broker of the cluster)?
is_our_broker() { # PID [PROPS]
  local args props=${2:-$PROPS}
  [[ $1 =~ ^[0-9]+$ ]] || return 1
  if [[ -r /proc/$1/cmdline ]]; then
    args=$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null) || return 1
  else
    args=$(ps -ww -o args= -p "$1" 2>/dev/null) || return 1
  fi
  [[ $args == *java* && $args == *" $BROKER_CLASS "* && $args == *"$props"* ]]
}

# The pid of our running broker (or of the one run with PROPS), from the pid file or (if that was
# lost) the process table.
our_pid() { # [PROPS PIDFILE]
  local pid props=${1:-$PROPS} pidfile=${2:-$PIDFILE}
  if [[ -f $pidfile ]]; then
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if is_our_broker "$pid" "$props"; then echo "$pid"; return 0; fi
  fi
  command -v pgrep >/dev/null 2>&1 || return 1
  for pid in $(pgrep -f 'kafka\.Kafka' 2>/dev/null || true); do
    if is_our_broker "$pid" "$props"; then echo "$pid"; return 0; fi
  done
  return 1
}

print_log_tail() {
  if [[ -f $LOG ]]; then
    echo "---- last 40 lines of $LOG ----" >&2
    tail -n 40 "$LOG" >&2
    echo "----" >&2
  fi
}

stop_pid() { # PID
  local pid=$1 waited=0
  kill -TERM "$pid" 2>/dev/null || return 0
  while kill -0 "$pid" 2>/dev/null; do
    if ((waited >= KAFKA_STOP_TIMEOUT * 10)); then
      log "broker (pid $pid) still running after ${KAFKA_STOP_TIMEOUT}s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.5
      break
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
}

write_server_properties() {
  cat >"$PROPS" <<EOF
# Generated by scripts/kafka.sh on every \`up\`: edits here are overwritten.
# One node that is both the KRaft controller and the broker, for tests on one machine.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$DATA
num.partitions=1
default.replication.factor=1
auto.create.topics.enable=$KAFKA_AUTO_CREATE_TOPICS
$(one_node_properties)
${KAFKA_EXTRA_PROPERTIES:-}
EOF
}

# The settings of a one-node cluster, shared by the plain and the secured broker.
one_node_properties() {
  cat <<EOF
min.insync.replicas=1
# Internal topics on one node: replication 1, and fewer partitions than the default 50, so the
# first consumer group and the first transactional producer do not wait for 50 partitions.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# No 3 s wait before the first rebalance of a new group.
group.initial.rebalance.delay.ms=0
# The only broker is never fenced by its own controller (default: after 9 s without a
# heartbeat). On this project's 2-core VMs the broker's JVM was seen frozen twice for 13.5 s
# (no safepoint, no log line; other processes ran); on resuming, its controller fenced it,
# every partition changed leader epoch at once, and tests failed on the churn (issue 19). A
# fence moves nothing on one node (there is no other broker), so it can only hurt; a broker
# that is really gone is gone either way. The 3-broker cluster keeps the default: there,
# fencing a dead broker is what moves its partitions.
broker.session.timeout.ms=60000
# After an unclean stop (SIGKILL, a machine restart), the restarted controller still holds the
# old broker's registration until that session expires, 60 s above, and refuses the new one
# until then. The broker gives up on registering after 60 s by default, so it lost that race
# and exited (seen 2026-12-03 after a VM restart); it now waits long enough to win it.
initial.broker.registration.timeout.ms=120000
EOF
}

# Raises this shell's open-file limit to KAFKA_NOFILE, for the broker it is about to exec. A
# broker keeps a file open per log segment of every partition it hosts (plus sockets and its
# jars), so this limit caps its partitions: with the 20000 it inherited here, it died with "Too
# many open files" at about 15,000 partitions, which test runs that left their topics behind
# reached in a day. Kafka's operations guide suggests at least 100000 as a starting point. The
# hard limit can only be raised by root (CAP_SYS_RESOURCE); otherwise the soft limit goes up to
# the hard one, with a warning.
raise_open_files() {
  local want=$KAFKA_NOFILE hard soft
  hard=$(ulimit -Hn)
  if [[ $hard != unlimited ]] && ((hard < want)); then
    ulimit -Hn "$want" 2>/dev/null || want=$hard
  fi
  ulimit -Sn "$want" 2>/dev/null || true
  soft=$(ulimit -Sn)
  if [[ $soft != unlimited ]] && ((soft < KAFKA_NOFILE)); then
    log "warning: the broker may open at most $soft files (KAFKA_NOFILE=$KAFKA_NOFILE): every log segment of every partition holds one open; raise the hard limit (ulimit -Hn, limits.conf, LimitNOFILE)"
  fi
}

# Starts a broker JVM with PROPS in the background, its output to LOG (the previous one kept as
# LOG.1), and prints its pid. Fails (with the log's tail) if it does not even start. EXTRA_OPT:
# one more JVM option, kept whole (a -D whose value is a path).
launch_broker() { # PROPS LOG HEAP_OPTS [EXTRA_OPT]
  local props=$1 log=$2 cp pid
  cp=$(classpath)
  if [[ -f $log ]]; then mv -f "$log" "$log.1"; fi
  local -a jvm
  read -r -a jvm <<<"$3 -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true $KAFKA_JVM_OPTS"
  if [[ -n ${4:-} ]]; then jvm+=("$4"); fi
  # Every pause of the JVM (GC and other safepoints) in gc.log beside the broker's log, with
  # wall-clock times: when a broker goes silent, this says whether the JVM stopped itself or the
  # machine stopped it (issue 19; scripts/test.sh prints the longest pauses when a test fails).
  jvm+=("-Xlog:gc,safepoint:file=$(dirname -- "$log")/gc.log:time,uptime,level,tags:filecount=2,filesize=10m")
  # setsid: the broker outlives the shell (and terminal) that ran `up`. 8>&- 9>&-: it must not
  # inherit the locks.
  local launcher=()
  if command -v setsid >/dev/null 2>&1; then launcher=(setsid); fi
  (
    cd "$(dirname -- "$props")"
    raise_open_files
    exec ${launcher[@]+"${launcher[@]}"} nohup "$JAVA" "${jvm[@]}" \
      -Dkafka.log.level=INFO -Dkafka.log.target=SYSTEM_OUT \
      -Dlog4j2.configurationFile="$LOG_CONF_DIR/log4j2.properties" \
      -cp "$cp" "$BROKER_CLASS" "$props" </dev/null >"$log" 2>&1 8>&- 9>&-
  ) &
  pid=$!
  # $! is the broker itself (the subshell execs setsid, which execs nohup, which execs java)
  # unless setsid had to fork; then find the broker by its command line.
  local tries=0
  until is_our_broker "$pid" "$props"; do
    if ((tries >= 50)) || ! kill -0 "$pid" 2>/dev/null; then
      if ! pid=$(our_pid "$props" /nonexistent); then
        LOG=$log print_log_tail
        die "the broker did not start; its log: $log"
      fi
      break
    fi
    sleep 0.1
    tries=$((tries + 1))
  done
  echo "$pid"
}

# Wait until the broker PID answers at 127.0.0.1:KAFKA_PORT. Returns 1 if the process died, 2 on
# timeout.
wait_ready() { # PID
  local pid=$1 deadline
  deadline=$(($(now_ms) + KAFKA_START_TIMEOUT * 1000))
  while :; do
    kill -0 "$pid" 2>/dev/null || return 1
    # The raw probe (no JVM) every 0.25 s; once it sees a live broker, confirm with Kafka's own
    # admin tool (a JVM, 1-2 s), at most once a second.
    if kafka_metadata_ok 127.0.0.1 "$KAFKA_PORT"; then
      kafka_tool_ok "127.0.0.1:$KAFKA_PORT" && return 0
      (($(now_ms) < deadline)) || return 2
      sleep 1
    else
      (($(now_ms) < deadline)) || return 2
      sleep 0.25
    fi
  done
}

# ---------------------------------------------------------------------------------------------
# Commands

lock_state() {
  mkdir -p "$STATE"
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$STATE/.lock"
    flock 9
  fi
}

cmd_up() {
  local start host port rc pid
  start=$(now_ms)
  lock_state
  host=$(bootstrap_host)
  port=$(bootstrap_port)

  rc=0
  answers "$host" "$port" || rc=$?
  if ((rc == 0)); then
    if pid=$(our_pid); then
      log "our broker (pid $pid) already answers at $host:$port: reusing it"
    else
      log "a Kafka broker already answers at $host:$port (not started by this script): reusing it"
    fi
    return 0
  fi

  need_java
  ensure_jars

  if pid=$(our_pid); then
    # Started by an earlier `up` that is still starting it: wait for it too, unless it was
    # started for another port.
    local running_port
    running_port=$(sed -n 's|^advertised\.listeners=PLAINTEXT://[^:]*:\([0-9]*\).*|\1|p' "$PROPS" 2>/dev/null || true)
    if [[ -n $running_port && $running_port != "$KAFKA_PORT" ]]; then
      die "our broker (pid $pid) already runs on port $running_port, not KAFKA_PORT=$KAFKA_PORT: run scripts/kafka.sh down first"
    fi
    log "our broker (pid $pid) is running but does not answer yet: waiting for it"
  else
    if [[ "$host:$port" != "127.0.0.1:$KAFKA_PORT" && "$host:$port" != "localhost:$KAFKA_PORT" ]]; then
      log "nothing answers at KAFKA_BOOTSTRAP=$KAFKA_BOOTSTRAP; starting a local broker on 127.0.0.1:$KAFKA_PORT"
    fi
    if port_open 127.0.0.1 "$KAFKA_PORT"; then
      die "port $KAFKA_PORT is in use by something that is not a ready Kafka broker: free it or set KAFKA_PORT"
    fi
    if port_open 127.0.0.1 "$KAFKA_CONTROLLER_PORT"; then
      die "controller port $KAFKA_CONTROLLER_PORT is in use: free it or set KAFKA_CONTROLLER_PORT"
    fi

    write_server_properties
    mkdir -p "$DATA"
    if [[ ! -f $DATA/meta.properties ]]; then
      local cluster_id
      tool_jvm "$STORAGE_TOOL_CLASS"
      cluster_id=$("${TOOL_CMD[@]}" "$STORAGE_TOOL_CLASS" random-uuid)
      log "formatting $DATA (cluster id $cluster_id)"
      if ! "${TOOL_CMD[@]}" "$STORAGE_TOOL_CLASS" format --cluster-id "$cluster_id" --config "$PROPS" \
        >"$STATE/format.log" 2>&1; then
        cat "$STATE/format.log" >&2
        die "formatting the KRaft storage in $DATA failed"
      fi
    fi

    pid=$(launch_broker "$PROPS" "$LOG" "$KAFKA_HEAP_OPTS")
    echo "$pid" >"$PIDFILE"
    log "started broker (pid $pid) on 127.0.0.1:$KAFKA_PORT, controller 127.0.0.1:$KAFKA_CONTROLLER_PORT; waiting up to ${KAFKA_START_TIMEOUT}s"
  fi

  rc=0
  wait_ready "$pid" || rc=$?
  case $rc in
    0)
      log "broker ready at 127.0.0.1:$KAFKA_PORT (pid $pid); up took $(elapsed "$start")"
      ;;
    1)
      rm -f "$PIDFILE"
      print_log_tail
      die "the broker (pid $pid) exited before answering; its log: $LOG"
      ;;
    *)
      print_log_tail
      log "stopping the broker (pid $pid) that did not answer in ${KAFKA_START_TIMEOUT}s"
      stop_pid "$pid"
      rm -f "$PIDFILE"
      die "the broker did not answer at 127.0.0.1:$KAFKA_PORT within ${KAFKA_START_TIMEOUT}s (KAFKA_START_TIMEOUT); its log: $LOG"
      ;;
  esac
}

# Prints 1 if `down`'s arguments ask for --wipe (or KAFKA_WIPE=1), else 0; refuses anything else.
wipe_flag() {
  local wipe=$KAFKA_WIPE
  while (($#)); do
    case $1 in
      --wipe) wipe=1 ;;
      *) die "down: unknown argument '$1' (usage: down [--brokers N] [--wipe])" ;;
    esac
    shift
  done
  echo "$wipe"
}

cmd_down() {
  local wipe pid start
  wipe=$(wipe_flag "$@")
  start=$(now_ms)
  lock_state
  if pid=$(our_pid); then
    log "stopping broker (pid $pid)"
    stop_pid "$pid"
    if kill -0 "$pid" 2>/dev/null; then die "broker (pid $pid) is still running"; fi
    log "stopped in $(elapsed "$start")"
  else
    log "no broker started by this script is running"
  fi
  rm -f "$PIDFILE"
  if [[ $wipe == 1 ]]; then
    rm -rf "$DATA"
    log "deleted $DATA"
  fi
}

cmd_status() {
  local host port pid rc=0
  host=$(bootstrap_host)
  port=$(bootstrap_port)
  if pid=$(our_pid); then
    echo "our broker: running (pid $pid), 127.0.0.1:$KAFKA_PORT, log $LOG"
  else
    echo "our broker: not running"
  fi
  answers "$host" "$port" || rc=$?
  case $rc in
    0) echo "$host:$port: a Kafka broker answers"; return 0 ;;
    1) echo "$host:$port: nothing listens"; return 1 ;;
    3) echo "$host:$port: a Kafka broker answers but lists no live broker yet (starting?)"; return 1 ;;
    *) echo "$host:$port: something listens but does not answer as a Kafka broker"; return 1 ;;
  esac
}

cmd_logs() {
  local follow=0 lines=100
  while (($#)); do
    case $1 in
      -f | --follow) follow=1 ;;
      -n) shift; lines=${1:-100} ;;
      [0-9]*) lines=$1 ;;
      *) die "logs: unknown argument '$1' (usage: logs [-f] [N])" ;;
    esac
    shift
  done
  [[ -f $LOG ]] || die "no broker log yet ($LOG): run scripts/kafka.sh up"
  if ((follow)); then exec tail -n "$lines" -F "$LOG"; fi
  tail -n "$lines" "$LOG"
}

cmd_classpath() {
  ensure_jars
  classpath
}

# At most KAFKA_TOOL_SLOTS `tool` JVMs of this checkout run at once; the others wait for a slot.
# scripts/acls.sh starts one AclCommand JVM per entry of a role, side by side, and the security
# tests apply several roles at once: in a fresh-clone suite run (2026-12-04, ci28) dozens of tool
# JVMs starting together held the load at 30-40 on two cores for minutes, starving the brokers
# and the binaries under test, and three tests failed. Their CPU is the same in turns; the
# brokers keep their share. A slot is a lock file held with flock on fd 9, which the JVM inherits
# (exec), so the slot is free again when the JVM ends, however it ends.
tool_slot() {
  local slots=${KAFKA_TOOL_SLOTS:-2} i
  [[ $slots =~ ^[0-9]+$ ]] || die "KAFKA_TOOL_SLOTS must be a number, not '$slots'"
  ((slots > 0)) && command -v flock >/dev/null && mkdir -p "$STATE/tool-slots" 2>/dev/null || return 0
  for ((i = 0; i < slots; i++)); do
    exec 9>"$STATE/tool-slots/$i"
    flock -n 9 && return 0
  done
  # All taken: wait for one, spread by PID.
  exec 9>"$STATE/tool-slots/$(($$ % slots))"
  flock 9
}

cmd_tool() {
  (($#)) || die "usage: scripts/kafka.sh tool CLASS [ARGS...]  (e.g. org.apache.kafka.tools.TopicCommand --bootstrap-server 127.0.0.1:9092 --list)"
  need_java
  ensure_jars
  local cls=$1 rc=0
  shift
  tool_slot
  tool_jvm "$cls" --dump
  [[ -n $TOOL_ARCHIVE ]] || exec "${TOOL_CMD[@]}" "$cls" "$@"
  "${TOOL_CMD[@]}" "$cls" "$@" || rc=$?
  # A JVM ended by a signal may have left its archive half-written.
  if ((rc < 128)) && [[ -s $TOOL_ARCHIVE.$$ ]]; then mv -f "$TOOL_ARCHIVE.$$" "$TOOL_ARCHIVE"; else rm -f "$TOOL_ARCHIVE.$$"; fi
  return "$rc"
}

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
}

# The cluster's commands live in kafka/cluster.sh, the secured broker's in kafka/secure.sh.
# shellcheck source=kafka/cluster.sh
source "$SCRIPT_DIR/kafka/cluster.sh"
# shellcheck source=kafka/secure.sh
source "$SCRIPT_DIR/kafka/secure.sh"

main() {
  local cmd=${1:-} args=() secure=0
  (($#)) && shift
  # --brokers N (or KAFKA_BROKERS=N) with N > 1: up, down, status and logs act on the cluster;
  # --secure: on the secured broker.
  while (($#)); do
    case $1 in
      --brokers) shift; KAFKA_BROKERS=${1:-} ;;
      --brokers=*) KAFKA_BROKERS=${1#--brokers=} ;;
      --secure) secure=1 ;;
      *) args+=("$1") ;;
    esac
    shift
  done
  set -- ${args[@]+"${args[@]}"}
  if ((secure)); then
    secure_main "$cmd" "$@"
    return
  fi
  [[ $KAFKA_BROKERS =~ ^[0-9]+$ ]] || die "--brokers/KAFKA_BROKERS must be a number, not '$KAFKA_BROKERS'"
  if ((KAFKA_BROKERS > 1)); then
    case $cmd in
      up) cluster_up "$KAFKA_BROKERS"; return ;;
      down) cluster_down "$@"; return ;;
      status) cluster_status "$@"; return ;;
      logs) cluster_logs "$@"; return ;;
    esac
  fi
  case $cmd in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    status) cmd_status "$@" ;;
    logs) cmd_logs "$@" ;;
    broker) cmd_broker "$@" ;;
    classpath) cmd_classpath "$@" ;;
    tool) cmd_tool "$@" ;;
    -h | --help | help) usage ;;
    '') usage >&2; exit 2 ;;
    *) log "unknown command '$cmd'"; usage >&2; exit 2 ;;
  esac
}

main "$@"
