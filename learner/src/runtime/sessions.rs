//! Sessions: a peer's hello (its token checked, its id given, its welcome
//! sent) and the envelope every later message must carry.

use std::time::Instant;

use net::link::tokens_match;
use net::protocol::{Header, Message, Role};

use super::core::{Coordinator, Peer};

impl Coordinator {
    /// A hello: refused without the cluster token; else the peer gets an
    /// id (the same one for a hello said again by the same process) and
    /// the welcome, and an actor its share of credits.
    pub(super) fn hello(
        &mut self,
        now: Instant,
        from: Vec<u8>,
        header: &Header,
        role: Role,
        token: &str,
    ) {
        if !tokens_match(token, &self.setup.token) {
            self.report.refused_peers += 1;
            let said = || format!("refused a {role:?}: wrong cluster token");
            self.warner.warn("wrong token", now, said);
            self.send(
                &from,
                Message::Refused {
                    reason: "wrong cluster token".into(),
                    retry: false,
                },
            );
            return;
        }
        // A hello said again by the same process (the learner was slow to
        // welcome it) keeps its id: the peer takes the first welcome it
        // gets, whichever of them.
        let id = match self.peers.get(&from) {
            Some(p) if p.incarnation == header.incarnation => p.id,
            _ => self.new_peer_id(),
        };
        tracing::info!("{role:?} {id} joined");
        self.forget(now, &from);
        let session = self.new_session();
        let peer = Peer::new(role, id, session, header, now);
        self.peers.insert(from.clone(), peer);
        let welcome = Message::Welcome {
            peer: id,
            config_toml: self.setup.welcome_config.clone(),
            tasks: self.setup.rollout_tasks.clone(),
        };
        self.send(&from, welcome);
        if role == Role::Actor {
            self.share_credits(now);
        }
    }

    /// The role of the peer `from`, when `message` comes in its session:
    /// from a peer that said hello, with its id, its incarnation and a
    /// sequence number above its last. Otherwise the message is dropped
    /// and counted (a stranger is told to say hello first).
    pub(super) fn check_envelope(
        &mut self,
        now: Instant,
        from: &[u8],
        header: &Header,
        message: &Message,
    ) -> Option<Role> {
        let Some(peer) = self.peers.get_mut(from) else {
            self.report.unexpected += 1;
            let kind = message.kind();
            let said = || format!("dropped a {kind:?} from a peer that never said hello");
            self.warner.warn("no hello", now, said);
            self.send(
                from,
                Message::Refused {
                    reason: "unknown peer: say hello first".into(),
                    retry: true,
                },
            );
            return None;
        };
        if header.sender != peer.id
            || header.incarnation != peer.incarnation
            || header.seq <= peer.last_seq
        {
            self.report.bad_envelopes += 1;
            let said = || {
                format!(
                    "{:?} {}: dropped {:?} whose envelope does not match (sender {}, \
                     incarnation {:#x}, seq {}; expected sender {}, incarnation {:#x}, seq \
                     above {})",
                    peer.role,
                    peer.id,
                    message.kind(),
                    header.sender,
                    header.incarnation,
                    header.seq,
                    peer.id,
                    peer.incarnation,
                    peer.last_seq
                )
            };
            self.warner.warn("bad envelope", now, said);
            return None;
        }
        peer.last_seq = header.seq;
        peer.last_seen = now;
        Some(peer.role)
    }
}
