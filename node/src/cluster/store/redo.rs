//! A group's redo (spec/replication.md §14, *State*): every change the group made to the replica's
//! tables, in the order made, as the value stored after the merge or a removal. Replaying it is
//! putting, so a start may replay a group the B-tree already holds.
//!
//! Encoding: per change, one byte (the table, with [`REMOVED`] set for a removal), the key's
//! length (`u32` LE) and the key, then for a put the value's length (`u32` LE) and the value. The
//! log's entry checksums the whole payload, so a decode failure here is a bug or a disk the log's
//! checksum missed: corruption either way.

/// The tables a group writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    Records = 0,
    Names = 1,
    Deleted = 2,
    Tasks = 3,
    Dedups = 4,
}

/// The flag on a change's first byte that makes it a removal.
const REMOVED: u8 = 0x80;

impl Table {
    fn from_byte(byte: u8) -> Option<Table> {
        Some(match byte {
            0 => Table::Records,
            1 => Table::Names,
            2 => Table::Deleted,
            3 => Table::Tasks,
            4 => Table::Dedups,
            _ => return None,
        })
    }
}

/// One change as replay applies it.
#[derive(Debug, PartialEq, Eq)]
pub struct Change<'a> {
    pub table: Table,
    pub key: &'a [u8],
    /// The value stored, or `None`: removed.
    pub value: Option<&'a [u8]>,
}

/// A group's changes as they are made, encoded as they come.
#[derive(Debug, Default)]
pub struct Redo {
    bytes: Vec<u8>,
}

fn length(bytes: &[u8]) -> [u8; 4] {
    u32::try_from(bytes.len())
        .expect("a key or value far below 4 GiB")
        .to_le_bytes()
}

impl Redo {
    /// Records that `table` now holds `value` at `key`.
    pub fn put(&mut self, table: Table, key: &[u8], value: &[u8]) {
        self.bytes.push(table as u8);
        self.bytes.extend_from_slice(&length(key));
        self.bytes.extend_from_slice(key);
        self.bytes.extend_from_slice(&length(value));
        self.bytes.extend_from_slice(value);
    }

    /// Records that `table` no longer holds `key`.
    pub fn remove(&mut self, table: Table, key: &[u8]) {
        self.bytes.push(table as u8 | REMOVED);
        self.bytes.extend_from_slice(&length(key));
        self.bytes.extend_from_slice(key);
    }

    /// Whether nothing changed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The encoded changes: a log entry's payload.
    #[must_use]
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// The changes `payload` holds, in order, or where it stops making sense.
///
/// # Errors
/// The offset of the first change that does not decode.
pub fn decode(payload: &[u8]) -> Result<Vec<Change<'_>>, usize> {
    fn take<'a>(rest: &mut &'a [u8], at: usize) -> Result<&'a [u8], usize> {
        let (len, tail) = rest.split_at_checked(4).ok_or(at)?;
        let len = u32::from_le_bytes(len.try_into().map_err(|_| at)?) as usize;
        let (bytes, tail) = tail.split_at_checked(len).ok_or(at)?;
        *rest = tail;
        Ok(bytes)
    }
    let mut changes = Vec::new();
    let mut rest = payload;
    while let Some((&first, tail)) = rest.split_first() {
        let at = payload.len() - rest.len();
        let table = Table::from_byte(first & !REMOVED).ok_or(at)?;
        rest = tail;
        let key = take(&mut rest, at)?;
        let value = if first & REMOVED == 0 {
            Some(take(&mut rest, at)?)
        } else {
            None
        };
        changes.push(Change { table, key, value });
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn table() -> impl Strategy<Value = Table> {
        prop_oneof![
            Just(Table::Records),
            Just(Table::Names),
            Just(Table::Deleted),
            Just(Table::Tasks),
            Just(Table::Dedups),
        ]
    }

    proptest! {
        /// What a group recorded is what replay reads back, in order; a payload cut anywhere
        /// inside a change does not decode.
        #[test]
        fn changes_decode_as_recorded(
            changes in prop::collection::vec(
                (table(), prop::collection::vec(any::<u8>(), 0..40),
                 prop::option::of(prop::collection::vec(any::<u8>(), 0..60))),
                0..12),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut redo = Redo::default();
            for (table, key, value) in &changes {
                match value {
                    Some(value) => redo.put(*table, key, value),
                    None => redo.remove(*table, key),
                }
            }
            prop_assert_eq!(redo.is_empty(), changes.is_empty());
            let decoded = decode(redo.bytes()).unwrap();
            let expected: Vec<Change<'_>> = changes
                .iter()
                .map(|(table, key, value)| Change {
                    table: *table,
                    key,
                    value: value.as_deref(),
                })
                .collect();
            prop_assert_eq!(decoded, expected);
            if !redo.is_empty() {
                let cut = cut.index(redo.bytes().len());
                // Where each change starts: a cut there is a shorter list, anywhere else an error.
                let mut starts = vec![0];
                let mut offset = 0;
                for (_, key, value) in &changes {
                    offset += 1 + 4 + key.len() + value.as_ref().map_or(0, |v| 4 + v.len());
                    starts.push(offset);
                }
                let result = decode(&redo.bytes()[..cut]);
                if starts.contains(&cut) {
                    prop_assert!(result.is_ok());
                } else {
                    prop_assert!(result.is_err());
                }
            }
        }
    }

    #[test]
    fn an_unknown_table_does_not_decode() {
        assert_eq!(decode(&[7, 0, 0, 0, 0]), Err(0));
    }
}
