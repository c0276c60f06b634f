#!/bin/bash
# Makes the TLS material the security tests use, with the openssl command,
# in directory $1 (created):
#   ca.pem ca.key             the cluster's CA
#   server.pem server.key     signed by ca, CN=hymcache-server, SAN
#                             IP:127.0.0.1, DNS:localhost
#   admin.pem admin.key       client certificate CN=hym-admin (signed by ca)
#   node.pem node.key         client certificate CN=hym-node, SAN
#                             DNS:node-a.hymcache.test (signed by ca)
#   other-ca.pem other.pem other.key
#                             another CA and a server certificate it signed
#                             (same names as server.pem)
#   expired.pem expired.key   signed by ca, same names as server.pem,
#                             valid only in January 2020
# EC P-256 keys keep it fast (well under a second).
set -euo pipefail
out=$1
mkdir -p "$out"
cd "$out"

key() { openssl ecparam -name prime256v1 -genkey -noout -out "$1" 2>/dev/null; }

ca() {  # name
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 3650 \
    -subj "/CN=$1 test CA" -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
}

# name cn san ca
leaf() {
  key "$1.key"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
  printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$4.pem" -CAkey "$4.key" \
    -CAcreateserial -out "$1.pem" -days 365 -extfile "$1.ext" 2>/dev/null
}

ca ca
ca other-ca
leaf server hymcache-server "IP:127.0.0.1,DNS:localhost" ca
leaf admin hym-admin "DNS:hym-admin" ca
leaf node hym-node "DNS:node-a.hymcache.test" ca
leaf other hymcache-server "IP:127.0.0.1,DNS:localhost" other-ca

# An expired certificate: `openssl ca` takes explicit validity dates.
key expired.key
openssl req -new -key expired.key -out expired.csr -subj "/CN=hymcache-server" \
  2>/dev/null
mkdir -p ca.db
: > ca.db/index.txt
cat > ca.db/openssl.cnf <<EOF
[ ca ]
default_ca = test
[ test ]
dir = $out/ca.db
database = \$dir/index.txt
new_certs_dir = \$dir
serial = \$dir/serial
default_md = sha256
policy = any
copy_extensions = none
x509_extensions = ext
unique_subject = no
[ any ]
commonName = supplied
[ ext ]
subjectAltName = IP:127.0.0.1,DNS:localhost
basicConstraints = CA:FALSE
EOF
echo 01 > ca.db/serial
openssl ca -batch -config ca.db/openssl.cnf -cert ca.pem -keyfile ca.key \
  -in expired.csr -out expired.pem -startdate 20200101000000Z \
  -enddate 20200201000000Z -notext 2>/dev/null
