#!/usr/bin/env bash
# The lab VM's services (Vagrantfile; run after scripts/setup.sh): Prometheus scraping the lab's
# exporter (`fabric-emu lab ... --metrics-port 9464`, on the VM's loopback) and Grafana with the
# fabric-emu dashboard. Idempotent. VM only: it adds Grafana's apt repository and starts
# services; CI and the README's machines do not run it.
#
# Prometheus and Grafana listen on the VM's addresses so that VirtualBox's NAT can forward
# 9090 and 3000 to the host; the Vagrantfile binds those forwards to the host's 127.0.0.1, and
# the VM has no other network, so nothing beyond the host reaches them. fabric-emu's own
# listeners (exporter, controller API) stay on the VM's loopback.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
log() { echo "lab-vm: $*"; }

# Prometheus (installed by setup.sh, its Debian service masked): our own unit, our config.
install -d -m 755 /var/lib/fabric-emu/prometheus
cat > /etc/systemd/system/fabric-emu-prometheus.service <<UNIT
[Unit]
Description=Prometheus scraping fabric-emu's exporter (127.0.0.1:9464)
After=network.target

[Service]
ExecStart=/usr/bin/prometheus --config.file=$repo/docs/prometheus/prometheus.yml \
  --storage.tsdb.path=/var/lib/fabric-emu/prometheus --storage.tsdb.retention.time=7d \
  --web.listen-address=0.0.0.0:9090
Restart=on-failure

[Install]
WantedBy=multi-user.target
UNIT

# Grafana: not a Debian/Ubuntu package; from Grafana's own apt repository.
if ! dpkg -s grafana >/dev/null 2>&1; then
  log "installing Grafana from apt.grafana.com"
  apt-get install -y -qq --no-install-recommends apt-transport-https gnupg wget >/dev/null
  install -d -m 755 /etc/apt/keyrings
  wget -q -O - https://apt.grafana.com/gpg.key | gpg --dearmor --yes -o /etc/apt/keyrings/grafana.gpg
  echo "deb [signed-by=/etc/apt/keyrings/grafana.gpg] https://apt.grafana.com stable main" \
    > /etc/apt/sources.list.d/grafana.list
  apt-get update -qq
  apt-get install -y -qq grafana >/dev/null
fi
install -d -m 755 /etc/grafana/provisioning/datasources /etc/grafana/provisioning/dashboards \
  /var/lib/grafana/dashboards
cat > /etc/grafana/provisioning/datasources/fabric-emu.yaml <<'YAML'
apiVersion: 1
datasources:
  - name: Prometheus
    type: prometheus
    access: proxy
    url: http://127.0.0.1:9090
    isDefault: true
YAML
cat > /etc/grafana/provisioning/dashboards/fabric-emu.yaml <<'YAML'
apiVersion: 1
providers:
  - name: fabric-emu
    type: file
    options: {path: /var/lib/grafana/dashboards}
YAML
cp "$repo/docs/grafana/fabric-emu.json" /var/lib/grafana/dashboards/fabric-emu.json

systemctl daemon-reload
systemctl enable --now fabric-emu-prometheus.service grafana-server.service
log "Prometheus on :9090, Grafana on :3000 (admin/admin; host: http://127.0.0.1:3000)"
