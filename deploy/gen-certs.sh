#!/bin/bash
# Make the TLS material of the external-snapshot-metadata sidecar with
# openssl: a CA and a server certificate for the sidecar's Service.
#
#   deploy/gen-certs.sh [-n NAMESPACE] [-s SERVICE] [-d DAYS] OUTDIR
#
# Writes OUTDIR/ca.crt, ca.key, tls.crt, tls.key (ECDSA P-256), and
# ca.crt.b64: the CA's PEM in base64 on one line, as the SnapshotMetadataService
# CR's caCert (`format: byte`) must be; a Secret's data, which kustomize wraps
# at 70 columns, cannot be copied there. The server
# certificate names SERVICE.NAMESPACE (the host in the SnapshotMetadataService
# CR's spec.address), SERVICE.NAMESPACE.svc and SERVICE.NAMESPACE.svc.cluster.local.
# An existing CA in OUTDIR is kept, so that renewing the server certificate
# leaves the CR's caCert as it is. The examples' kustomizations read OUTDIR=certs
# (next to their kustomization.yaml) with a secretGenerator.
#
# Defaults: NAMESPACE ceph-csi-rbd, SERVICE csi-rbdplugin-snapshot-metadata,
# DAYS 365 (the CA: 3650).
set -euo pipefail
NS=ceph-csi-rbd SVC=csi-rbdplugin-snapshot-metadata DAYS=365
while getopts n:s:d: o; do
	case $o in
	n) NS=$OPTARG ;;
	s) SVC=$OPTARG ;;
	d) DAYS=$OPTARG ;;
	*) sed -n '5p' "$0" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
OUT=${1:?usage: gen-certs.sh [-n NAMESPACE] [-s SERVICE] [-d DAYS] OUTDIR}
command -v openssl >/dev/null || { echo "gen-certs: openssl is needed (apt-get install openssl)" >&2; exit 2; }
mkdir -p "$OUT"
cd "$OUT"
umask 077

if [ ! -s ca.crt ] || [ ! -s ca.key ]; then
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 \
		-keyout ca.key -out ca.crt -days 3650 -subj "/CN=$SVC CA" \
		-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
fi
ext=$(mktemp)
trap 'rm -f "$ext" tls.csr' EXIT
cat >"$ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:$SVC.$NS,DNS:$SVC.$NS.svc,DNS:$SVC.$NS.svc.cluster.local
EXT
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 \
	-keyout tls.key -out tls.csr -subj "/CN=$SVC.$NS" 2>/dev/null
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 \
	-days "$DAYS" -extfile "$ext" -out tls.crt 2>/dev/null
rm -f ca.srl
base64 -w0 ca.crt >ca.crt.b64
chmod 644 ca.crt ca.crt.b64 tls.crt
echo "gen-certs: $PWD/{ca.crt,ca.crt.b64,tls.crt,tls.key} for $SVC.$NS (server certificate valid $DAYS days)" >&2
