//! `clink cast job`: a cast run as one job of a launcher (`mpirun`, `srun`). Every rank
//! runs the same command; rank 0 is the source and ranks 1 to N are the receivers, in
//! rank order. The ranks learn each other's addresses from the launcher's PMIx service
//! ([`clink::Context::from_launcher_with`]), so nothing is typed in or passed around.

use super::*;
use clap::Args;

/// `clink cast job` arguments.
#[derive(Args, Debug)]
pub struct JobArgs {
    /// The file rank 0 sends, or `-` for rank 0's standard input.
    file: String,
    /// The receivers' output file: `{rank}` stands for a receiver's rank and `{host}` for
    /// its host's name (for ranks sharing a file system).
    #[arg(long)]
    out: String,
    #[command(flatten)]
    stream: StreamArgs,
}

/// This host's name.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// A receiver's output file from the `--out` template.
fn out_of(template: &str, rank: u32, host: &str) -> std::path::PathBuf {
    template
        .replace("{rank}", &rank.to_string())
        .replace("{host}", host)
        .into()
}

/// Runs this rank's part of the job.
pub fn run(a: JobArgs) -> Result<(), String> {
    let (ctx, job) = Context::from_launcher_with(config()?).map_err(|e| e.to_string())?;
    let (rank, size) = (job.rank(), job.size());
    if size < 2 {
        return Err(format!(
            "a cast job needs two ranks or more (rank 0 sends, the others receive); this one has {size}"
        ));
    }
    let open = |ctx: &Context| ctx.endpoint().map_err(|e| format!("clink endpoint: {e}"));
    let exchange = |ep: &Endpoint| {
        job.exchange_addresses(&ep.address())
            .map_err(|e| format!("rank {rank}: exchanging addresses: {e}"))
    };
    if rank == 0 {
        let ep = open(&ctx)?;
        let addrs = exchange(&ep)?;
        let send = SendArgs {
            file: a.file,
            to: addrs[1..].to_vec(),
            hosts: Vec::new(),
            via: DEFAULT_VIA.into(),
            out: None,
            remote_clink: None,
            stream: a.stream,
        };
        return source::cast(send, Some(ep));
    }
    let recv = RecvArgs {
        out: out_of(&a.out, rank, &host_name()),
        listen_file: None,
        window: a.stream.window,
        // Rank 0 prints every report.
        json: false,
        corrupt_chunk: None,
        chunk_pause_ms: None,
        no_repair: false,
        rejoin: None,
    };
    // Before the exchange: a receiver that cannot write ends the job (its launcher stops
    // the other ranks) instead of joining the chain.
    let ready = node::Ready::prepare(&recv)?;
    let ep = open(&ctx)?;
    exchange(&ep)?;
    node::serve(recv, ep, ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_receiver_names_its_own_copy() {
        assert_eq!(
            out_of("/data/{host}/image.{rank}", 3, "n7"),
            std::path::PathBuf::from("/data/n7/image.3")
        );
        assert_eq!(
            out_of("/data/image", 3, "n7"),
            std::path::PathBuf::from("/data/image")
        );
    }
}
