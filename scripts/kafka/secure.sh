# shellcheck shell=bash
# scripts/kafka/secure.sh: the local SECURED broker of scripts/kafka.sh (sourced by it; not a
# command of its own). Production clusters are authenticated, encrypted and authorised; this
# broker is, too, so that the processor's refusals (wrong password, missing ACL, untrusted
# certificate) can be tested for real instead of assumed:
#
#   - one KRaft node (broker and controller in one JVM), a process of its own beside the plain
#     broker and the cluster, with its own state folder and ports;
#   - clients: SASL_SSL with SCRAM-SHA-512 on 127.0.0.1:KAFKA_SECURE_PORT (default 29094); the
#     broker's certificate is signed by a CA generated here (openssl), SAN IP:127.0.0.1;
#   - clients that log in with OIDC: SASL_SSL with OAUTHBEARER on a listener of its own, OAUTH, on
#     127.0.0.1:KAFKA_SECURE_OAUTH_PORT (default 29095), same certificate. Kafka's own
#     OAuthBearerValidatorCallbackHandler checks each token's RS256 signature against a JWKS file
#     written here (file: URL, allowed by the JVM property
#     org.apache.kafka.sasl.oauthbearer.allowed.urls, which Kafka 4 requires), its expiry, its
#     issuer and its audience; the principal is User:<sub>. The token endpoint is not part of the
#     broker: it is whatever holds the signing key (the tests start one:
#     src/tools/token_endpoint.rs). The listener re-authenticates sessions
#     (connections.max.reauth.ms), so a client whose token expires must have refreshed it;
#   - the KRaft controller listener: SASL_PLAINTEXT with PLAIN, one user (the super-user), on
#     127.0.0.1:KAFKA_SECURE_CONTROLLER_PORT (default 29093). SCRAM cannot serve it (the SCRAM
#     credentials live in the metadata log the controller serves), and a plaintext controller
#     listener would make every anonymous local connection a super-user;
#   - the StandardAuthorizer, allow.everyone.if.no.acl.found=false, super.users=User:admin;
#   - SCRAM users created at format time (kafka-storage format --add-scram): admin (the
#     super-user, for set-up and ACLs only), pipeline, sink, deliver, tools and replay.
#     Passwords are random, written only into mode-600 files of the state folder, never printed
#     (except by the explicit `password USER` command).
#
# State (git-ignored, .kafka/secure/; `down --secure --wipe` deletes it all, secrets included):
#   tls/ca.pem                 the CA that clients trust (ssl.ca.location); ca.key stays here too
#   tls/untrusted-ca.pem       a second, unrelated CA: what a client with the wrong CA sees
#   tls/broker.p12             the broker's key and certificate (PKCS12), password in tls/store.pass
#   credentials/USER.password  one password per SCRAM user (mode 600)
#   credentials/USER.oidc-secret  the OIDC client secret of each client id (= user name) but admin
#   oauth/signing.key          the token issuer's RSA private key (PKCS8 PEM, mode 600)
#   oauth/jwks.json            its public half as a JWKS (kid price-alerts-local-1): what the
#                              broker validates tokens with
#   clients/USER.toml          a `[librdkafka]` table for the project's binaries (--config), 600
#   clients/USER.properties    the same for Kafka's Java tools (--command-config), 600
#   server.properties, data/, broker.log, broker.pid, format.log
#
# Environment variables read: KAFKA_SECURE_PORT (29094), KAFKA_SECURE_CONTROLLER_PORT (29093),
# KAFKA_SECURE_OAUTH_PORT (29095), KAFKA_SECURE_HEAP_OPTS ("-Xms256m -Xmx512m").

KAFKA_SECURE_PORT=${KAFKA_SECURE_PORT:-29094}
KAFKA_SECURE_OAUTH_PORT=${KAFKA_SECURE_OAUTH_PORT:-29095}
KAFKA_SECURE_CONTROLLER_PORT=${KAFKA_SECURE_CONTROLLER_PORT:-29093}
KAFKA_SECURE_HEAP_OPTS=${KAFKA_SECURE_HEAP_OPTS:--Xms256m -Xmx512m}
SECURE="$STATE/secure"
SECURE_DATA="$LOG_ROOT/secure/data" # KAFKA_LOG_ROOT, as the single broker's
SECURE_PROPS="$SECURE/server.properties"
SECURE_PIDFILE="$SECURE/broker.pid"
SECURE_LOG="$SECURE/broker.log"
# The super-user first: it is the one the broker itself authenticates as.
SECURE_USERS=(admin pipeline sink deliver tools replay)
# The OIDC client ids: the same names, so a token's sub gives the same principal (User:NAME) and
# scripts/acls.sh grants both logins at once. Not admin: set-up stays on SCRAM.
OIDC_CLIENTS=(pipeline sink deliver tools replay)
# What the broker expects of a token, and what the tests' token endpoint puts in one
# (`env --secure` prints them).
OAUTH_ISSUER=price-alerts-local-oidc
OAUTH_AUDIENCE=price-alerts-secure-broker
OAUTH_KID=price-alerts-local-1

secure_bootstrap() { echo "127.0.0.1:$KAFKA_SECURE_PORT"; }
secure_oauth_bootstrap() { echo "127.0.0.1:$KAFKA_SECURE_OAUTH_PORT"; }
secure_jwks_url() { echo "file://$SECURE/oauth/jwks.json"; }
secure_pid() { our_pid "$SECURE_PROPS" "$SECURE_PIDFILE"; }
secure_password() { cat "$SECURE/credentials/$1.password"; }

need_openssl() {
  command -v openssl >/dev/null 2>&1 \
    || die "openssl not found: install it (apt-get install openssl); it makes the secured broker's certificates"
}

# A random secret: letters and digits only, so it needs no quoting in JAAS, TOML or properties.
random_secret() { openssl rand -hex 24; }

# Writes FILE with mode 600 from stdin (created that way, never readable by others for a moment).
write_secret_file() { # FILE
  (umask 077 && cat >"$1")
}

# The CA, the broker certificate (SAN IP:127.0.0.1, localhost) in a PKCS12 keystore, and an
# unrelated CA for the negative test. Made once; `down --secure --wipe` removes them.
secure_make_tls() {
  local tls="$SECURE/tls"
  [[ -f $tls/broker.p12 && -f $tls/ca.pem && -f $tls/untrusted-ca.pem ]] && return 0
  need_openssl
  rm -rf "$tls"
  mkdir -p "$tls"
  chmod 700 "$tls"
  (
    cd "$tls"
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 30 -keyout ca.key -out ca.pem \
      -subj "/CN=price-alerts local test CA" 2>/dev/null
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 30 -keyout untrusted-ca.key -out untrusted-ca.pem \
      -subj "/CN=price-alerts UNTRUSTED test CA" 2>/dev/null
    rm -f untrusted-ca.key
    openssl req -newkey rsa:2048 -nodes -sha256 -keyout broker.key -out broker.csr -subj "/CN=127.0.0.1" 2>/dev/null
    printf '%s\n' 'subjectAltName=IP:127.0.0.1,DNS:localhost' 'basicConstraints=CA:FALSE' \
      'keyUsage=digitalSignature,keyEncipherment' 'extendedKeyUsage=serverAuth,clientAuth' >broker.ext
    openssl x509 -req -sha256 -days 30 -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
      -extfile broker.ext -out broker.pem 2>/dev/null
    random_secret >store.pass
    openssl pkcs12 -export -in broker.pem -inkey broker.key -certfile ca.pem -name broker \
      -out broker.p12 -passout "file:store.pass"
    rm -f broker.csr broker.ext ca.srl
    chmod 644 ca.pem untrusted-ca.pem broker.pem
  ) || die "making the TLS certificates with openssl failed"
  log "made a CA and the broker certificate in $tls"
}

# base64url without padding (RFC 7515), of stdin.
base64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }

# The token issuer's RSA signing key and its JWKS (the public modulus and exponent, base64url).
# Made once, like the certificates; `down --secure --wipe` removes them.
secure_make_oauth() {
  local dir="$SECURE/oauth" hex n
  [[ -f $dir/signing.key && -f $dir/jwks.json ]] && return 0
  need_openssl
  rm -rf "$dir"
  mkdir -p "$dir"
  chmod 700 "$dir"
  (umask 077 && openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$dir/signing.key" 2>/dev/null) \
    || die "making the OIDC signing key with openssl failed"
  hex=$(openssl rsa -in "$dir/signing.key" -noout -modulus 2>/dev/null | cut -d= -f2)
  [[ $hex =~ ^[0-9A-F]+$ ]] || die "reading the OIDC signing key's modulus failed"
  # Hex to bytes with printf's own escapes (no xxd needed), then base64url. The exponent of
  # openssl's RSA keys is 65537: AQAB.
  # shellcheck disable=SC2059 # the format is the bytes
  n=$(printf "$(sed 's/../\\x&/g' <<<"$hex")" | base64url)
  printf '{"keys":[{"kty":"RSA","use":"sig","alg":"RS256","kid":"%s","n":"%s","e":"AQAB"}]}\n' \
    "$OAUTH_KID" "$n" >"$dir/jwks.json"
  chmod 644 "$dir/jwks.json"
  log "made the OIDC signing key and its JWKS in $dir"
}

# One random password per user, and the client configuration files that carry it.
secure_make_credentials() {
  local user pw
  mkdir -p "$SECURE/credentials" "$SECURE/clients"
  chmod 700 "$SECURE/credentials" "$SECURE/clients"
  for user in "${SECURE_USERS[@]}"; do
    if [[ ! -s $SECURE/credentials/$user.password ]]; then
      random_secret | write_secret_file "$SECURE/credentials/$user.password"
    fi
    pw=$(secure_password "$user")
    write_secret_file "$SECURE/clients/$user.toml" <<EOF
# librdkafka settings of the SCRAM user '$user' on the secured local broker (scripts/kafka.sh
# up --secure). For the project's binaries: --config THIS_FILE. Mode 600: it holds a password.
[librdkafka]
"security.protocol" = "SASL_SSL"
"sasl.mechanism" = "SCRAM-SHA-512"
"sasl.username" = "$user"
"sasl.password" = "$pw"
"ssl.ca.location" = "$SECURE/tls/ca.pem"
EOF
    write_secret_file "$SECURE/clients/$user.properties" <<EOF
# Java client settings of the SCRAM user '$user' (Kafka's tools: --command-config THIS_FILE).
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$user" password="$pw";
ssl.truststore.type=PEM
ssl.truststore.location=$SECURE/tls/ca.pem
# Generous: the tools run as JVMs on machines that may be busy.
request.timeout.ms=30000
default.api.timeout.ms=60000
EOF
  done
  # The OIDC client secrets: what the token endpoint checks (an IdP's client registrations).
  for user in "${OIDC_CLIENTS[@]}"; do
    if [[ ! -s $SECURE/credentials/$user.oidc-secret ]]; then
      random_secret | write_secret_file "$SECURE/credentials/$user.oidc-secret"
    fi
  done
}

secure_write_server_properties() {
  local admin_pw store_pw
  admin_pw=$(secure_password admin)
  store_pw=$(cat "$SECURE/tls/store.pass")
  write_secret_file "$SECURE_PROPS" <<EOF
# Generated by scripts/kafka.sh up --secure on every start: edits here are overwritten.
# Mode 600: it holds the super-user's password and the keystore's.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_SECURE_CONTROLLER_PORT
listeners=SASL_SSL://127.0.0.1:$KAFKA_SECURE_PORT,OAUTH://127.0.0.1:$KAFKA_SECURE_OAUTH_PORT,CONTROLLER://127.0.0.1:$KAFKA_SECURE_CONTROLLER_PORT
advertised.listeners=SASL_SSL://127.0.0.1:$KAFKA_SECURE_PORT,OAUTH://127.0.0.1:$KAFKA_SECURE_OAUTH_PORT
listener.security.protocol.map=SASL_SSL:SASL_SSL,OAUTH:SASL_SSL,CONTROLLER:SASL_PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=SASL_SSL
# Clients and the broker itself: SCRAM-SHA-512 over TLS.
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$admin_pw";
# Clients with OIDC tokens: OAUTHBEARER on the OAUTH listener (TLS as above). Kafka's validator
# checks the RS256 signature against the JWKS file (reloaded when it changes), exp, iss and aud
# (Kafka 4.4 refuses to start without an expected issuer and audience); the principal is the sub
# claim. Sessions are re-authenticated before the token expires (KIP-368), so a client must have
# refreshed its token by then, or its connection is closed.
listener.name.oauth.sasl.enabled.mechanisms=OAUTHBEARER
listener.name.oauth.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required ;
listener.name.oauth.oauthbearer.sasl.server.callback.handler.class=org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler
listener.name.oauth.oauthbearer.connections.max.reauth.ms=600000
sasl.oauthbearer.jwks.endpoint.url=$(secure_jwks_url)
sasl.oauthbearer.expected.issuer=$OAUTH_ISSUER
sasl.oauthbearer.expected.audience=$OAUTH_AUDIENCE
sasl.oauthbearer.sub.claim.name=sub
# The default skew is 30 s; a short one keeps an expired token from being accepted for long.
sasl.oauthbearer.clock.skew.seconds=5
# The controller listener: PLAIN with the one super-user (SCRAM's credentials live in the very
# metadata log the controller serves, so SCRAM cannot authenticate to it).
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$admin_pw" user_admin="$admin_pw";
ssl.keystore.type=PKCS12
ssl.keystore.location=$SECURE/tls/broker.p12
ssl.keystore.password=$store_pw
# The broker's own client side (inter-broker) trusts the same CA as every client.
ssl.truststore.type=PEM
ssl.truststore.location=$SECURE/tls/ca.pem
ssl.client.auth=none
# Authorisation: ACLs in the metadata log; nothing is allowed that no ACL allows.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin
log.dirs=$SECURE_DATA
num.partitions=1
default.replication.factor=1
auto.create.topics.enable=false
$(one_node_properties)
EOF
}

# Is the secured broker ready? Kafka's own admin client, as the super-user, lists topics.
secure_ready() {
  tool_jvm "$TOPIC_TOOL_CLASS"
  timeout 20 "${TOOL_CMD[@]}" "$TOPIC_TOOL_CLASS" --bootstrap-server "$(secure_bootstrap)" \
    --command-config "$SECURE/clients/admin.properties" --list >/dev/null 2>&1
}

secure_up() {
  local start pid
  start=$(now_ms)
  lock_state
  need_java
  ensure_jars
  if pid=$(secure_pid); then
    if secure_ready; then
      log "our secured broker (pid $pid) already answers at $(secure_bootstrap): reusing it"
      return 0
    fi
    log "our secured broker (pid $pid) is running but does not answer yet: waiting for it"
  else
    local port
    for port in "$KAFKA_SECURE_PORT" "$KAFKA_SECURE_OAUTH_PORT" "$KAFKA_SECURE_CONTROLLER_PORT"; do
      if port_open 127.0.0.1 "$port"; then
        die "port $port is in use: free it or set KAFKA_SECURE_PORT / KAFKA_SECURE_OAUTH_PORT / KAFKA_SECURE_CONTROLLER_PORT"
      fi
    done
    mkdir -p "$SECURE"
    chmod 700 "$SECURE"
    secure_make_tls
    secure_make_credentials
    secure_make_oauth
    secure_write_server_properties
    if [[ ! -f $SECURE_DATA/meta.properties ]]; then
      local cluster_id user scram=()
      tool_jvm "$STORAGE_TOOL_CLASS"
      for user in "${SECURE_USERS[@]}"; do
        scram+=(--add-scram "SCRAM-SHA-512=[name=$user,password=$(secure_password "$user")]")
      done
      cluster_id=$("${TOOL_CMD[@]}" "$STORAGE_TOOL_CLASS" random-uuid)
      log "formatting $SECURE_DATA (cluster id $cluster_id) with SCRAM users: ${SECURE_USERS[*]}"
      if ! "${TOOL_CMD[@]}" "$STORAGE_TOOL_CLASS" format --cluster-id "$cluster_id" --config "$SECURE_PROPS" \
        "${scram[@]}" >"$SECURE/format.log" 2>&1; then
        cat "$SECURE/format.log" >&2
        die "formatting the secured broker's storage in $SECURE_DATA failed"
      fi
    fi
    # Kafka 4 reads no OAuth URL that this JVM property does not list (CVE-2025-27817).
    pid=$(launch_broker "$SECURE_PROPS" "$SECURE_LOG" "$KAFKA_SECURE_HEAP_OPTS" \
      "-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=$(secure_jwks_url)")
    echo "$pid" >"$SECURE_PIDFILE"
    log "started the secured broker (pid $pid): SASL_SSL on $(secure_bootstrap), OAUTHBEARER on $(secure_oauth_bootstrap), controller 127.0.0.1:$KAFKA_SECURE_CONTROLLER_PORT"
  fi
  local deadline=$(($(now_ms) + KAFKA_START_TIMEOUT * 1000))
  until secure_ready; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$SECURE_PIDFILE"
      LOG=$SECURE_LOG print_log_tail
      die "the secured broker (pid $pid) exited before answering; its log: $SECURE_LOG"
    fi
    if (($(now_ms) >= deadline)); then
      LOG=$SECURE_LOG print_log_tail
      stop_pid "$pid"
      rm -f "$SECURE_PIDFILE"
      die "the secured broker did not answer within ${KAFKA_START_TIMEOUT}s; its log: $SECURE_LOG"
    fi
    sleep 1
  done
  log "secured broker ready at $(secure_bootstrap) (pid $pid); up took $(elapsed "$start")"
}

secure_down() {
  local wipe pid
  wipe=$(wipe_flag "$@")
  lock_state
  if pid=$(secure_pid); then
    log "stopping the secured broker (pid $pid)"
    stop_pid "$pid"
    if kill -0 "$pid" 2>/dev/null; then die "secured broker (pid $pid) is still running"; fi
  else
    log "no secured broker started by this script is running"
  fi
  rm -f "$SECURE_PIDFILE"
  if [[ $wipe == 1 ]]; then
    rm -rf "$SECURE" "$LOG_ROOT/secure"
    log "deleted $SECURE (data, certificates and passwords)"
  fi
}

secure_status() {
  local pid
  if ! pid=$(secure_pid); then
    echo "secured broker: not running"
    return 1
  fi
  if secure_ready; then
    echo "secured broker: running (pid $pid), SASL_SSL $(secure_bootstrap), OAUTHBEARER $(secure_oauth_bootstrap), state $SECURE"
    return 0
  fi
  echo "secured broker: running (pid $pid) but not answering at $(secure_bootstrap)"
  return 1
}

# What a client of the secured broker needs to know, as shell exports; no secret in it (the
# passwords, client secrets and the signing key stay in their files under KAFKA_SECURE_DIR).
secure_env() {
  [[ -f $SECURE/tls/ca.pem ]] || die "no secured broker state in $SECURE: run scripts/kafka.sh up --secure"
  echo "export KAFKA_SECURE_BOOTSTRAP=$(secure_bootstrap)"
  echo "export KAFKA_SECURE_DIR=$SECURE"
  echo "export KAFKA_SECURE_CA=$SECURE/tls/ca.pem"
  echo "export KAFKA_SECURE_OAUTH_BOOTSTRAP=$(secure_oauth_bootstrap)"
  echo "export KAFKA_SECURE_OAUTH_ISSUER=$OAUTH_ISSUER"
  echo "export KAFKA_SECURE_OAUTH_AUDIENCE=$OAUTH_AUDIENCE"
}

secure_main() { # CMD ARGS...
  local cmd=$1
  shift
  case $cmd in
    up) secure_up "$@" ;;
    down) secure_down "$@" ;;
    status) secure_status "$@" ;;
    logs) LOG=$SECURE_LOG cmd_logs "$@" ;;
    env) secure_env ;;
    password)
      [[ $# == 1 && -f $SECURE/credentials/$1.password ]] || die "usage: password --secure USER (one of: ${SECURE_USERS[*]})"
      secure_password "$1"
      ;;
    *) die "$cmd does not take --secure (up, down, status, logs, env, password do)" ;;
  esac
}
