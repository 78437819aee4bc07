//! One replica of a NATS cluster in a runtime of its own, for the tests that run several in
//! one process (`cluster.rs`, `tasks.rs`): killed (power loss) or stopped gracefully.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gateway_core::Registry;
use gateway_server::cluster::nats::{NatsEngine, NatsOptions};
use gateway_server::cluster::replica::ClusterOptions;
use gateway_server::{serve, ServerOptions};
use tokio::sync::oneshot;

pub(crate) struct Replica {
    pub(crate) addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
    stop: Option<oneshot::Sender<()>>,
    done: Option<oneshot::Receiver<std::io::Result<()>>>,
}

impl Replica {
    /// Replica `name` of the cluster on `nats`, serving `registry`, its claims lasting
    /// `claim_ttl` (`None`: the default), on a free loopback port.
    pub(crate) fn start(
        nats: &str,
        name: &str,
        registry: Registry,
        claim_ttl: Option<Duration>,
    ) -> Replica {
        gateway_tests::init_tracing();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let (done_tx, done) = oneshot::channel();
        let (nats, replica) = (nats.to_owned(), name.to_owned());
        let seed = [name.bytes().map(u32::from).sum::<u32>() as u8; 32];
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let engine = NatsEngine::connect(NatsOptions::new(nats, replica.clone()))
                .await
                .expect("the replica reaches nats-server");
            let mut opts = ServerOptions::new(registry, seed);
            let mut cluster = ClusterOptions::new(
                Arc::new(engine),
                replica,
                gateway_tests::test_cluster_keys(),
            );
            if let Some(ttl) = claim_ttl {
                cluster.claim_ttl = ttl;
            }
            opts.cluster = Some(cluster);
            opts.shutdown_grace = Duration::from_secs(2);
            let served = serve(listener, opts, async {
                let _ = stopped.await;
            })
            .await;
            let _ = done_tx.send(served);
        });
        Replica {
            addr,
            runtime: Some(runtime),
            stop: Some(stop),
            done: Some(done),
        }
    }

    /// `http://addr`, its base URL.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its MCP endpoint.
    pub(crate) fn mcp(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Power loss: the runtime and everything on it (sockets, the NATS connection) is gone at
    /// once; nothing is released or said goodbye to.
    pub(crate) fn kill(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }

    /// A graceful shutdown, which must succeed within 20 s.
    pub(crate) async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(done) = self.done.take() {
            tokio::time::timeout(Duration::from_secs(20), done)
                .await
                .expect("the replica stops within 20 s")
                .unwrap()
                .unwrap();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}
