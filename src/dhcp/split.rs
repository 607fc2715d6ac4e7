//! Which appliance answers which client when several share one fleet (issue 28 item 2):
//! RFC 3074 load balancing over the live appliances. Pure: a request and the live set in,
//! "answer it here" or not out.
//!
//! - The client's bucket (0..=255) is RFC 3074 §6's hash (`loadb_p_hash`, Pearson's hash
//!   with the RFC's mixing table, seeded with the key's length, over the key from its last
//!   byte to its first) of the client identifier (option 61) when present and non-empty,
//!   else of chaddr: as Kea's HA hook does (`QueryFilter::loadBalance`, isc-projects/kea
//!   `src/hooks/dhcp/high_availability/query_filter.cc`).
//! - RFC 3074 leaves the Hash Bucket Assignment to configuration; here it follows from the
//!   live set (the `members/` keys in etcd): each bucket goes to the member whose name
//!   scores highest for it (rendezvous hashing), so every appliance computes the same
//!   assignment from the same set, the buckets spread about evenly, and when a member's
//!   etcd lease expires only its buckets move, to the survivors, at once.
//! - Balanced are the messages that start or restart a binding without naming a server:
//!   DISCOVER, and a REQUEST without a server identifier (INIT-REBOOT, REBINDING; RFC 3074
//!   §3 lets only the server the hash selects answer these). A REQUEST naming a server
//!   identifier (SELECTING) is answered only by that server, which `decide` already does
//!   (RFC 2131 §4.3.2); RELEASE and DECLINE name their server too. INFORM and the PXE boot
//!   server port (4011, unicast to one server) are not balanced.
//! - Reservations need nothing special: every appliance has the inventory, so the bucket's
//!   owner offers the machine its reserved address.

use dhcproto::v4::{DhcpOption, Message, MessageType, OptionCode};

/// RFC 3074 §6's mixing table (a permutation of 0..=255, from Pearson's paper).
const MIX: [u8; 256] = [
    251, 175, 119, 215, 81, 14, 79, 191, 103, 49, 181, 143, 186, 157, 0, 232, 31, 32, 55, 60, 152,
    58, 17, 237, 174, 70, 160, 144, 220, 90, 57, 223, 59, 3, 18, 140, 111, 166, 203, 196, 134, 243,
    124, 95, 222, 179, 197, 65, 180, 48, 36, 15, 107, 46, 233, 130, 165, 30, 123, 161, 209, 23, 97,
    16, 40, 91, 219, 61, 100, 10, 210, 109, 250, 127, 22, 138, 29, 108, 244, 67, 207, 9, 178, 204,
    74, 98, 126, 249, 167, 116, 34, 77, 193, 200, 121, 5, 20, 113, 71, 35, 128, 13, 182, 94, 25,
    226, 227, 199, 75, 27, 41, 245, 230, 224, 43, 225, 177, 26, 155, 150, 212, 142, 218, 115, 241,
    73, 88, 105, 39, 114, 62, 255, 192, 201, 145, 214, 168, 158, 221, 148, 154, 122, 12, 84, 82,
    163, 44, 139, 228, 236, 205, 242, 217, 11, 187, 146, 159, 64, 86, 239, 195, 42, 106, 198, 118,
    112, 184, 172, 87, 2, 173, 117, 176, 229, 247, 253, 137, 185, 99, 164, 102, 147, 45, 66, 231,
    52, 141, 211, 194, 206, 246, 238, 56, 110, 78, 248, 63, 240, 189, 93, 92, 51, 53, 183, 19, 171,
    72, 50, 33, 104, 101, 69, 8, 252, 83, 120, 76, 135, 85, 54, 202, 125, 188, 213, 96, 235, 136,
    208, 162, 129, 190, 132, 156, 38, 47, 1, 7, 254, 24, 4, 216, 131, 89, 21, 28, 133, 37, 153,
    149, 80, 170, 68, 6, 169, 234, 151,
];

/// RFC 3074 §6 `loadb_p_hash`: the bucket of `key`.
pub fn bucket_of(key: &[u8]) -> u8 {
    // The RFC seeds with the length as an unsigned char: keys longer than 255 wrap.
    let mut hash = key.len() as u8;
    for b in key.iter().rev() {
        hash = MIX[usize::from(hash ^ b)];
    }
    hash
}

/// The bucket of the client `msg` comes from: its client identifier (option 61), else
/// chaddr (its first `hlen` bytes).
pub fn client_bucket(msg: &Message) -> u8 {
    if let Some(DhcpOption::ClientIdentifier(id)) = msg.opts().get(OptionCode::ClientIdentifier)
        && !id.is_empty()
    {
        return bucket_of(id);
    }
    let hlen = usize::from(msg.hlen()).min(msg.chaddr().len());
    bucket_of(&msg.chaddr()[..hlen])
}

/// Whether `msg` is one only the owner of its bucket answers (see the module doc).
pub fn is_balanced(msg: &Message) -> bool {
    let names_server = msg.opts().get(OptionCode::ServerIdentifier).is_some();
    match msg.opts().msg_type() {
        Some(MessageType::Discover) => true,
        Some(MessageType::Request) => !names_server,
        _ => false,
    }
}

/// A stable 64-bit score of `name` for `bucket` (FNV-1a, then the splitmix64 finaliser to
/// spread it): the same on every appliance and every build.
fn score(name: &str, bucket: u8) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes().chain([0, bucket]) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The member of `live` that owns `bucket` (highest score; a tie goes to the smaller name),
/// `None` when `live` is empty.
pub fn owner(live: &[String], bucket: u8) -> Option<&str> {
    live.iter()
        .max_by(|a, b| score(a, bucket).cmp(&score(b, bucket)).then(b.cmp(a)))
        .map(String::as_str)
}

/// This appliance's share of the buckets among the live members.
#[derive(Clone, PartialEq, Eq)]
pub struct Split {
    mine: [bool; 256],
    members: usize,
}

impl std::fmt::Debug for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Split")
            .field("buckets", &self.mine.iter().filter(|m| **m).count())
            .field("members", &self.members)
            .finish()
    }
}

impl Split {
    /// The share of `me` among `live` (the members' names). `me` counts as live whatever
    /// the list says: an appliance that is serving is alive, and a list that lags behind
    /// its own registration must not leave its clients unanswered.
    pub fn new(me: &str, live: &[String]) -> Self {
        let mut names: Vec<String> = live.to_vec();
        if !names.iter().any(|n| n == me) {
            names.push(me.to_owned());
        }
        names.sort();
        names.dedup();
        let mut mine = [false; 256];
        for (b, m) in mine.iter_mut().enumerate() {
            *m = owner(&names, b as u8) == Some(me);
        }
        Self {
            mine,
            members: names.len(),
        }
    }

    /// Whether this appliance owns `bucket`.
    pub fn owns(&self, bucket: u8) -> bool {
        self.mine[usize::from(bucket)]
    }

    /// Whether this appliance answers `msg`: not balanced, or in one of its buckets.
    pub fn answers(&self, msg: &Message) -> bool {
        !is_balanced(msg) || self.owns(client_bucket(msg))
    }

    /// How many buckets this appliance owns.
    pub fn buckets(&self) -> usize {
        self.mine.iter().filter(|m| **m).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("appliance-{i}")).collect()
    }

    #[test]
    fn the_hash_follows_rfc_3074_section_6() {
        // The table is a permutation of 0..=255.
        let mut seen = [false; 256];
        for v in MIX {
            assert!(!seen[usize::from(v)]);
            seen[usize::from(v)] = true;
        }
        // Worked by hand from the RFC's code: seed = length, bytes last to first.
        assert_eq!(bucket_of(&[]), 0);
        assert_eq!(bucket_of(&[0]), MIX[1]); // 1 ^ 0 -> T[1] = 175
        assert_eq!(bucket_of(&[0]), 175);
        // [1, 2]: seed 2; T[2 ^ 2] = T[0] = 251; T[251 ^ 1] = T[250] = 170.
        assert_eq!(bucket_of(&[1, 2]), 170);
    }

    #[test]
    fn client_identifier_wins_over_chaddr_and_only_unaddressed_requests_are_balanced() {
        let chaddr = [2, 0, 0, 0, 0, 7];
        let mut msg = Message::default();
        msg.set_chaddr(&chaddr);
        msg.opts_mut()
            .insert(DhcpOption::MessageType(MessageType::Discover));
        assert_eq!(client_bucket(&msg), bucket_of(&chaddr));
        assert!(is_balanced(&msg));
        msg.opts_mut()
            .insert(DhcpOption::ClientIdentifier(vec![1, 2]));
        assert_eq!(client_bucket(&msg), 170);
        msg.opts_mut()
            .insert(DhcpOption::MessageType(MessageType::Request));
        assert!(is_balanced(&msg));
        msg.opts_mut()
            .insert(DhcpOption::ServerIdentifier([10, 0, 0, 1].into()));
        assert!(!is_balanced(&msg));
        msg.opts_mut()
            .insert(DhcpOption::MessageType(MessageType::Inform));
        assert!(!is_balanced(&msg));
    }

    #[test]
    fn buckets_are_spread_about_evenly() {
        for n in 2..=5 {
            let live = names(n);
            let shares: Vec<usize> = live
                .iter()
                .map(|m| Split::new(m, &live).buckets())
                .collect();
            assert_eq!(shares.iter().sum::<usize>(), 256, "{shares:?}");
            let fair = 256 / n;
            for s in &shares {
                // Rendezvous over 256 buckets: a binomial share, within 40% of fair here.
                assert!(s * 10 >= fair * 6 && s * 10 <= fair * 14, "{n}: {shares:?}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn every_client_has_exactly_one_owner_and_takeover_moves_only_the_dead_members_buckets(
            n in 2usize..6,
            dead in 0usize..6,
            key in proptest::collection::vec(any::<u8>(), 1..20),
        ) {
            let live = names(n);
            let b = bucket_of(&key);
            let owners: Vec<&String> = live.iter().filter(|m| Split::new(m, &live).owns(b)).collect();
            prop_assert_eq!(owners.len(), 1);
            let dead = dead % n;
            let survivors: Vec<String> =
                live.iter().enumerate().filter(|(i, _)| *i != dead).map(|(_, m)| m.clone()).collect();
            let splits: Vec<Split> = survivors.iter().map(|m| Split::new(m, &survivors)).collect();
            for bucket in 0..=255u8 {
                let before = owner(&live, bucket).unwrap();
                let after = owner(&survivors, bucket).unwrap();
                if before != live[dead] {
                    prop_assert_eq!(before, after, "bucket {} moved from a survivor", bucket);
                }
                prop_assert_eq!(splits.iter().filter(|s| s.owns(bucket)).count(), 1);
            }
        }
    }

    #[test]
    fn an_appliance_missing_from_the_list_still_answers_its_share() {
        let live = names(2);
        let me = "appliance-9";
        let split = Split::new(me, &live);
        let with_me: Vec<String> = live.iter().cloned().chain([me.to_owned()]).collect();
        assert_eq!(split, Split::new(me, &with_me));
        assert!(split.buckets() > 0);
        // Alone, it answers everyone.
        assert_eq!(Split::new(me, &[]).buckets(), 256);
    }
}
