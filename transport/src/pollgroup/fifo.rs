//! Intrusive FIFOs threaded through index arrays: a list head is two u32s, the links live in
//! one array sized at start (one entry per request or slot). So a qpair's waiting work costs
//! it eight bytes per list whatever its depth, and nothing allocates per I/O.
//!
//! An element is in at most one list of a given link array at a time (the owner's state enum
//! says which); `unlink` removes it from the middle in O(1) (an aborted request leaving the
//! buffer wait, say).

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Link {
    prev: u32,
    next: u32,
    linked: bool,
}

impl Default for Link {
    fn default() -> Self {
        Link {
            prev: NIL,
            next: NIL,
            linked: false,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Fifo {
    head: u32,
    tail: u32,
    len: u32,
}

impl Default for Fifo {
    fn default() -> Self {
        Fifo {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

impl Fifo {
    pub(crate) fn is_empty(&self) -> bool {
        self.head == NIL
    }

    pub(crate) fn len(&self) -> u32 {
        self.len
    }

    pub(crate) fn front(&self) -> Option<u32> {
        (self.head != NIL).then_some(self.head)
    }

    pub(crate) fn push_back(&mut self, links: &mut [Link], i: u32) {
        debug_assert!(
            !links[i as usize].linked,
            "element {i} is already in a list"
        );
        links[i as usize] = Link {
            prev: self.tail,
            next: NIL,
            linked: true,
        };
        if self.tail == NIL {
            self.head = i;
        } else {
            links[self.tail as usize].next = i;
        }
        self.tail = i;
        self.len += 1;
    }

    pub(crate) fn pop_front(&mut self, links: &mut [Link]) -> Option<u32> {
        let i = self.front()?;
        self.unlink(links, i);
        Some(i)
    }

    /// Empties the list, every element's link freed (the list's owner is going).
    pub(crate) fn clear(&mut self, links: &mut [Link]) {
        while self.pop_front(links).is_some() {}
    }

    /// Removes `i`, which must be in this list.
    pub(crate) fn unlink(&mut self, links: &mut [Link], i: u32) {
        let l = links[i as usize];
        if !l.linked {
            return;
        }
        if l.prev == NIL {
            self.head = l.next;
        } else {
            links[l.prev as usize].next = l.next;
        }
        if l.next == NIL {
            self.tail = l.prev;
        } else {
            links[l.next as usize].prev = l.prev;
        }
        links[i as usize] = Link::default();
        self.len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_order_and_unlink_from_the_middle() {
        let mut links = vec![Link::default(); 8];
        let mut f = Fifo::default();
        for i in [3, 1, 5, 7] {
            f.push_back(&mut links, i);
        }
        f.unlink(&mut links, 5);
        f.unlink(&mut links, 5); // not linked: no-op
        assert_eq!(f.len(), 3);
        let mut out = vec![];
        while let Some(i) = f.pop_front(&mut links) {
            out.push(i);
        }
        assert_eq!(out, vec![3, 1, 7]);
        assert!(f.is_empty());
        f.push_back(&mut links, 7);
        f.unlink(&mut links, 7);
        assert!(f.is_empty() && f.front().is_none());
        // Cleared: every link is free for another list.
        f.push_back(&mut links, 2);
        f.push_back(&mut links, 4);
        f.clear(&mut links);
        assert!(f.is_empty() && links.iter().all(|l| !l.linked));
    }
}
